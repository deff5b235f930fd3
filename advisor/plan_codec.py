"""The plan JSON's ``training`` and ``parallel`` blocks, written and read from the settings' records.

Each field of TrainingJob and Strategy carries a Setting (advisor.specs.setting); one walk over them
writes a block (the settings written always first, in declaration order, then those that differ from
their default, then each group whose member differs) and one walk reads it back, refusing unknown
keys and naming the key of a bad value. A new setting needs no code here.
"""

from __future__ import annotations

from dataclasses import MISSING, replace
from types import SimpleNamespace
from typing import Any, Iterable

from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy
from advisor.specs import _fields as f
from advisor.specs.job import TrainingJob, check_job_relations
from advisor.specs.setting import field_default, settings_of


def block_to_dict(obj: Any) -> dict[str, Any]:
    """A config dataclass instance as its plan block."""
    always: dict[str, Any] = {}
    changed: dict[str, Any] = {}
    groups: dict[str, list[tuple[str, Any, bool]]] = {}
    for fl, s in settings_of(type(obj)):
        if s.plan == "never":
            continue
        value = getattr(obj, fl.name)
        if s.plan == "always":
            always[fl.name] = s.write_plan(value)
        elif s.group is not None:
            groups.setdefault(s.group, []).append((fl.name, s.write_plan(value), value != field_default(fl)))
        elif value != field_default(fl):
            changed[fl.name] = s.write_plan(value)
    out = {**always, **changed}
    for members in groups.values():
        if any(differs for _, _, differs in members):
            out.update({name: value for name, value, _ in members})
    return out


def block_keys(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required keys, optional keys) of a config dataclass's plan block."""
    required, optional = [], []
    for fl, s in settings_of(cls):
        if s.plan != "never":
            (required if s.required else optional).append(fl.name)
    return tuple(required), tuple(optional)


def block_values(cls, data: dict[str, Any], origin: str, extra_keys: Iterable[str] = ()) -> dict[str, Any]:
    """The field values a plan block gives (defaults where absent), each read and checked by its setting;
    ``extra_keys``: other keys the block may hold (read by their own readers)."""
    required, optional = block_keys(cls)
    f.check_keys(data, origin, required, (*optional, *extra_keys))
    values = {}
    for fl, s in settings_of(cls):
        if s.plan == "never":
            continue
        default = field_default(fl)
        values[fl.name] = s.read_plan(data, fl.name, origin, None if default is MISSING else default)
    return values


def strategy_to_dict(s: Strategy, num_layers: int) -> dict[str, Any]:
    """The plan's ``parallel`` block of a strategy (its stage layers resolved)."""
    return block_to_dict(replace(s, stage_layers=s.resolved_stage_layers(num_layers)))


def strategy_from_dict(data: dict[str, Any], origin: str, extra_keys: Iterable[str] = ()) -> Strategy:
    o = f"{origin}: parallel"
    values = block_values(Strategy, data, o, extra_keys)
    _check(Strategy, values, lambda name: f"{o}: key '{name}'")
    return Strategy(**values)


def _check(cls, values: dict[str, Any], named) -> None:
    """Each value against its setting's bounds (a custom reader has checked its own)."""
    for fl, s in settings_of(cls):
        if s.read is None:
            s.check(values[fl.name], named(fl.name))


def training_to_dict(job: TrainingJob) -> dict[str, Any]:
    """The plan's ``training`` block of a job."""
    return block_to_dict(job)


def training_from_dict(data: dict[str, Any], origin: str, extra_keys: Iterable[str] = ()) -> TrainingJob:
    o = f"{origin}: training"
    values = block_values(TrainingJob, data, o, extra_keys)
    named = lambda name: f"{o}: key '{name}'"          # noqa: E731
    _check(TrainingJob, values, named)
    check_job_relations(SimpleNamespace(**values), named)
    try:
        return TrainingJob(**values)
    except AdvisorError as exc:      # a check the job makes beyond its settings' own
        raise AdvisorError(f"{o}: {exc}") from None
