"""What each export writes for the settings whose records say who runs them (advisor.specs.setting:
``Setting.frameworks`` maps a framework or export target to each value and how it spells it).

For a plan setting that differs from its default, a target either spells it (a command-line flag,
or a config key "path.to.key = value" merged into the target's config) or cannot, and then the
export reports it by name: the launch would not run as priced. No exporter writes code for such a
setting: a new one needs its record only.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterator

from advisor.plan import Plan
from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.setting import Setting, field_default, settings_of, spelling

TITLES = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan", "mindspore": "MindSpore"}


def _set(plan: Plan) -> Iterator[tuple[str, str, Setting, Any]]:
    """(block, name, setting, value) of the plan's settings with a frameworks map that are not at their default."""
    for block, obj, cls in (("training", plan.training, TrainingJob), ("parallel", plan.strategy, Strategy)):
        for fl, s in settings_of(cls):
            value = getattr(obj, fl.name)
            if s.frameworks is not None and value != field_default(fl):
                yield block, fl.name, s, value


def _spellings(plan: Plan, target: str, unsupported: list[str]) -> list[str]:
    out = []
    for block, name, s, value in _set(plan):
        text = spelling(s, value, target, plan.training.compute_dtype)
        if text is None:
            shown = str(value).lower() if isinstance(value, bool) else value
            unsupported.append(f"{block}.{name} = {shown}: {TITLES.get(target, target)} has no setting that runs it; "
                               "exported without it, so the launch does not run as priced")
        elif text:
            out.append(text)
    return out


def flags(plan: Plan, target: str, unsupported: list[str]) -> list[str]:
    """The command-line arguments a flag-driven target (Megatron-LM) takes for the plan's settings."""
    return [token for text in _spellings(plan, target, unsupported) for token in shlex.split(text)]


def keys(plan: Plan, target: str, unsupported: list[str]) -> dict[str, Any]:
    """The config keys ("section.key" -> value) a config-file target takes for the plan's settings."""
    out = {}
    for text in _spellings(plan, target, unsupported):
        path, _, raw = text.partition("=")
        out[path.strip()] = literal(raw.strip())
    return out


def merge(config: dict[str, Any], values: dict[str, Any], sections: bool = False) -> dict[str, Any]:
    """``values`` ("a.b.c" -> value) merged into a nested config; with ``sections`` (TOML tables) the path
    before the last dot names one table ("quantize.linear.float8")."""
    for path, value in values.items():
        if sections:
            table, _, key = path.rpartition(".")
            config.setdefault(table, {})[key] = value
            continue
        *parents, key = path.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    return config


def literal(text: str) -> Any:
    """A config value as written in a record: true/false, a number, or text (quotes optional)."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("\"'")
