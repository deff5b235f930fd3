"""One declaration per setting: the metadata record every field of the config dataclasses carries.

A setting is a field of one of the config dataclasses (advisor.specs.job: what is trained, how the
framework runs it, where it runs; advisor.space.strategy: how it is parallelised), declared with
``setting(...)``: its default, a docstring, the kind of value it takes and how it is given. From
those records, and nothing else, come

* the command-line options of ``estimate`` and ``recommend`` (advisor.commands.cli_settings),
* the plan JSON's ``training`` and ``parallel`` blocks, written and read (advisor.plan_codec),
* the pins ``recommend`` takes for what it searches (advisor.search.Pins),
* the checks of a value, naming the flag or the plan key it came from (``Setting.check``),
* the documentation of the settings (docs/settings.md, ``python -m advisor.commands.settings_doc``),
* which frameworks run each value, how each spells it, and so the refusal of a value the plan's
  framework does not run and what every export writes or reports (``Setting.frameworks``).

How a framework runs a plan (what the cost model prices) and what it runs structurally are its
record's (advisor.specs.frameworks).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits
from advisor.specs.untrusted import prefix


class _FieldDefault:
    """The marker of a flag whose default is the field's own."""

    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


FIELD_DEFAULT = _FieldDefault()

# The kinds of value a setting takes (checked by Setting.check, read from a plan by Setting.read_plan)
KINDS = ("positive_int", "non_negative_int", "positive_float", "non_negative_float", "fraction", "choice",
         "boolean", "names", "text", "custom")


@dataclass(frozen=True)
class Setting:
    """How one field is given, checked, saved and searched."""

    doc: str
    """What the setting is and decides, with the source of what it models."""
    kind: str = "custom"
    """The kind of value (KINDS); "custom": the field's own reader and writer (read, write)."""
    choices: tuple = ()
    """For "choice" and "names" (a list of choices): the values accepted."""
    minimum: float | None = None
    """The smallest value accepted, where it is not the kind's (a PUE of at least 1)."""
    maximum: float | None = None
    """The largest value accepted (advisor.specs.limits)."""
    optional: bool = False
    """None is a value (the framework's or the command's default)."""
    flags: tuple[str, ...] = ()
    """Command-line spellings (the first is the one messages name); none: not on the command line."""
    help: str = ""
    """The command-line help."""
    commands: tuple[str, ...] = ("estimate", "recommend")
    """The commands that take the flag."""
    required_on: tuple[str, ...] = ()
    """The commands on which the flag must be given."""
    metavar: str = ""
    """The value's name in the command-line help (default: its type)."""
    search: bool = False
    """``recommend`` searches it; its flag pins it (not given: searched)."""
    cli_default: Any = FIELD_DEFAULT
    """The flag's default where it is not the field's (None: the command derives it)."""
    invert: bool = False
    """The flag turns the setting off (``--moe-token-drop`` sets moe_dropless to false)."""
    parse: Callable[[str], Any] | None = None
    """Command-line text to value, for values typed as text (lists given as "a,b")."""
    plan: str = "when_set"
    """The plan JSON: "always" written, "when_set" written when not the default, "never" not saved."""
    group: str | None = None
    """Settings of one group are written together when any of them is set (the site: pue and grid)."""
    required: bool = False
    """A plan must give it."""
    frameworks: dict[str, dict[str, str]] | None = None
    """Who runs the setting's values other than its default, and how each spells it: framework (or export
    target) name -> value -> the flag ("--grad-reduce-in-bf16") or config key ("section.key = value") that
    turns it on. A key "value@dtype" holds for that compute dtype only. None: every framework runs every value.
    The frameworks' legality (check_frameworks for the job; advisor.space.rules.framework_rule for the
    strategy's on/off settings, in the search) and every export's writing and notes (advisor.export._settings)
    come from this map."""
    read: Callable[[dict, str, str], Any] | None = None
    """A custom plan reader (data, key, origin) -> value."""
    write: Callable[[Any], Any] | None = None
    """A custom plan writer: value -> JSON value."""

    @property
    def flag(self) -> str | None:
        return self.flags[0] if self.flags else None

    def check(self, value: Any, where: str) -> Any:
        """The value, refused naming ``where`` (a flag or "training: 'key'") unless it is of the setting's kind."""
        if value is None and self.optional:
            return None
        kind = self.kind
        if kind in ("positive_int", "non_negative_int"):
            low = 1 if kind == "positive_int" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                what = "a positive integer" if low else "a non-negative integer"
                raise AdvisorError(f"{where} must be {what}, got {prefix(value)}")
            bound = self.maximum if self.maximum is not None else limits.MAX_INT
            if value > bound:
                raise AdvisorError(f"{where} = {value} exceeds the bound {bound:,} advisor accepts "
                                   f"(advisor/specs/limits.py)")
        elif kind in ("positive_float", "non_negative_float", "fraction"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AdvisorError(f"{where} must be a finite number, got {prefix(value)}")
            bound = self.maximum if self.maximum is not None else limits.MAX_QUANTITY
            high = min(1.0, bound) if kind == "fraction" else bound
            if self.minimum is not None:
                low_ok, span = value >= self.minimum, f"[{self.minimum:g}, {high:g}]"
            elif kind == "non_negative_float":
                low_ok, span = value >= 0, f"[0, {high:g}]"
            else:
                low_ok, span = value > 0, f"(0, {high:g}]"
            if not low_ok or value > high:
                raise AdvisorError(f"{where} must be a number in {span}, got {prefix(value)}")
        elif kind == "choice":
            if value not in self.choices:
                raise AdvisorError(f"{where} must be one of {', '.join(map(str, self.choices))}, got {prefix(value)}")
        elif kind == "boolean":
            if not isinstance(value, bool):
                raise AdvisorError(f"{where} must be true or false, got {prefix(value)}")
        elif kind == "text":
            if not isinstance(value, str):
                raise AdvisorError(f"{where} must be text, got {prefix(value)}")
        elif kind == "names":
            if not isinstance(value, tuple) or any(v not in self.choices for v in value) or len(set(value)) != len(value):
                raise AdvisorError(f"{where} must be a list of distinct names among {', '.join(self.choices)}, "
                                   f"got {str(value)[:80]!r}")
        return value

    def given(self, value: Any, fallback: str) -> Any:
        """A command-line value as the setting holds it: text parsed, an inverted flag turned round, then
        checked, named by the flag (``fallback`` where the setting has none)."""
        if self.parse is not None and isinstance(value, str):
            value = self.parse(value)
        if self.invert:
            value = not value
        return self.check(value, self.flag or fallback)

    def read_plan(self, data: dict[str, Any], key: str, origin: str, default: Any) -> Any:
        """The value of ``key`` in a plan block (its default where absent), refused naming the key."""
        if self.read is not None:
            return self.read(data, key, origin)
        if key not in data:
            return default
        kind, value = self.kind, data[key]
        if value is None and self.optional:
            return None
        if kind == "positive_int":
            return f.positive_int(data, key, origin, maximum=None if self.maximum is None else int(self.maximum))
        if kind == "non_negative_int":
            return f.non_negative_int(data, key, origin, maximum=None if self.maximum is None else int(self.maximum))
        if kind == "positive_float":
            return f.positive_float(data, key, origin)
        if kind == "non_negative_float":
            return f.non_negative_float(data, key, origin)
        if kind == "fraction":
            return f.fraction(data, key, origin)
        if kind == "choice":
            return f.choice(data, key, origin, self.choices)
        if kind == "boolean":
            return f.boolean(data, key, origin)
        if kind == "names":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AdvisorError(f"{origin}: key '{key}' must be a list of names, got {prefix(value)}")
            return tuple(value)
        raise AdvisorError(f"{origin}: key '{key}' has no reader")   # a custom setting without one: a bug

    def write_plan(self, value: Any) -> Any:
        """The value as the plan JSON holds it."""
        if self.write is not None:
            return self.write(value)
        return list(value) if isinstance(value, tuple) else value


def setting(default: Any = MISSING, **record: Any) -> Field:
    """A dataclass field carrying its Setting record (``default``: the field's default; none: required)."""
    meta = {"setting": Setting(**record)}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def settings_of(cls) -> list[tuple[Field, Setting]]:
    """The fields of a config dataclass that carry a Setting, in declaration order."""
    return [(fl, fl.metadata["setting"]) for fl in fields(cls) if "setting" in fl.metadata]


def field_default(fl: Field) -> Any:
    """A field's default (MISSING when it has none)."""
    if fl.default is not MISSING:
        return fl.default
    if fl.default_factory is not MISSING:       # type: ignore[misc]
        return fl.default_factory()             # type: ignore[misc]
    return MISSING


def check_fields(obj: Any, where: Callable[[str], str]) -> None:
    """Check every setting of a config dataclass instance, naming each by ``where(field name)``."""
    for fl, s in settings_of(type(obj)):
        s.check(getattr(obj, fl.name), where(fl.name))


def spelling(s: Setting, value: Any, runner: str, dtype: str) -> str | None:
    """How ``runner`` (a framework or export target) turns ``value`` on (None: it does not run it); its
    default needs nothing ("")."""
    if s.frameworks is None:
        return ""
    table = s.frameworks.get(runner, {})
    key = str(value).lower() if isinstance(value, bool) else str(value)
    return table.get(f"{key}@{dtype}", table.get(key))


def as_given(cls, values: dict[str, Any]) -> dict[str, Any]:
    """Setting values by field name as the command line gives them (Setting.given turns them back): an inverted
    flag's value turned round (moe_dropless True is --moe-token-drop off)."""
    inverted = {fl.name for fl, s in settings_of(cls) if s.invert}
    return {k: (not v if k in inverted else v) for k, v in values.items()}


def check_frameworks(cls, obj: Any, framework: str, dtype: str, where: Callable[[str], str]) -> None:
    """Refuse a setting of ``cls`` (read from ``obj``) whose value the framework does not run (Setting.frameworks),
    naming it by ``where``; ``dtype``: the compute dtype."""
    for fl, s in settings_of(cls):
        value = getattr(obj, fl.name)
        if s.frameworks is None or value == field_default(fl):
            continue
        if spelling(s, value, framework, dtype) is None:
            runs = [name for name, table in s.frameworks.items() if any(k.split("@")[0] == _key(value) for k in table)]
            raise AdvisorError(f"{where(fl.name)} = {_key(value)}: framework {framework} does not run it"
                               + (f" ({', '.join(runs)} do)" if runs else ""))


def _key(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
