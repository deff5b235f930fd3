"""docs/settings.md, written from the settings' records (advisor.specs.setting): every setting of the job
(by concern), of the strategy and of the commands, with its flag, its plan key, whether recommend
searches it, its default, the frameworks that run it and what it is.

    python -m advisor.commands.settings_doc            # rewrite docs/settings.md
    python -m advisor.commands.settings_doc --check    # exit 1 if docs/settings.md is not what the records say
"""

from __future__ import annotations

import sys
from pathlib import Path

from advisor.specs.setting import FIELD_DEFAULT, Setting, field_default, settings_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def _sections():
    from advisor.commands.command_options import InputOptions, SearchOptions
    from advisor.space.strategy import Strategy
    from advisor.specs.job import Runtime, Workload
    from advisor.specs.site import Site

    return (("What is trained", "training", Workload), ("How the framework runs it", "training", Runtime),
            ("Where it runs", "training", Site), ("How it is parallelised", "parallel", Strategy),
            ("What to plan for", None, InputOptions), ("What the command does", None, SearchOptions))


def _default(fl, s: Setting) -> str:
    value = field_default(fl)
    if s.cli_default is None or value is None or (s.cli_default is FIELD_DEFAULT and value is None):
        return "derived" if s.cli_default is None and value is not None else ("none" if value is None else repr(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]" if value else "[]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _frameworks(s: Setting) -> str:
    if s.frameworks is None:
        return "all"
    return "; ".join(f"{name}: " + ", ".join(f"{key} (`{text}`)" if text else key for key, text in table.items())
                     for name, table in s.frameworks.items())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render() -> str:
    out = ["# Settings", "",
           "Written by `python -m advisor.commands.settings_doc` from the settings' records (advisor/specs/setting.py);",
           "do not edit by hand. A setting is declared once, as a field of a config dataclass with its record, and",
           "the command-line options, the plan JSON, recommend's pins, the frameworks' legality and the exports'",
           "notes come from that record.", "",
           "Columns: the flag (estimate and recommend; `pin` where recommend searches it and the flag fixes it), the",
           "plan JSON key (`always` written, `when set` written when not the default), the default (`derived`: from",
           "the model, hardware or other settings), the frameworks that run values other than the default, and what",
           "it is.", ""]
    for title, block, cls in _sections():
        out += [f"## {title} ({cls.__module__}.{cls.__name__})", "",
                "| setting | flag | plan | default | frameworks | what it is |", "|---|---|---|---|---|---|"]
        for fl, s in settings_of(cls):
            flag = ", ".join(f"`{f}`" for f in s.flags) + (" (pin)" if s.search else "") if s.flags else "-"
            commands = "" if not s.flags or s.commands == ("estimate", "recommend") else f" ({', '.join(s.commands)})"
            plan = "-" if block is None or s.plan == "never" else f"`{block}.{fl.name}` {s.plan.replace('_', ' ')}"
            out.append(f"| {fl.name} | {_cell(flag + commands)} | {_cell(plan)} | {_cell(_default(fl, s))} | "
                       f"{_cell(_frameworks(s))} | {_cell(s.doc)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is not what the settings' records say: run python -m advisor.commands.settings_doc")
            return 1
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
