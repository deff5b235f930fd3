"""The command line that gives a job and a strategy: each setting that differs from what the command line
assumes, as its record's flag and value (the reverse of advisor.commands.cli_settings). Settings a command
line cannot give are returned by name, so that a caller can say why a run cannot be entered as priced."""

from __future__ import annotations

from typing import Any

from advisor.space.strategy import Strategy, even_stage_layers
from advisor.specs.job import TrainingJob
from advisor.specs.setting import field_default, settings_of

# derived by the command line from the settings given: the micro-batches from the global batch, dp from the devices
DERIVED = {"num_micro_batches", "dp"}


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


ALWAYS = {"global_batch_size", "seq_length"}   # the command line's own defaults for these are the model's


def words(command: str, job: TrainingJob, strategy: Strategy, num_layers: int) -> tuple[list[str], list[str]]:
    """(the flags and values that give ``job`` and ``strategy`` to ``command``, the settings that differ from
    what the command line assumes and have no flag on it)."""
    out: list[str] = []
    missing: list[str] = []
    for cls, obj in ((TrainingJob, job), (Strategy, strategy)):
        for fl, s in settings_of(cls):
            value = getattr(obj, fl.name)
            if fl.name in DERIVED or (fl.name not in ALWAYS and value == field_default(fl)):
                continue
            if fl.name == "stage_layers" and value == even_stage_layers(num_layers, strategy.pp):
                continue
            if fl.name == "pipeline_schedule" and value == ("interleaved-1f1b" if strategy.virtual_pipeline_stages > 1
                                                            else "1f1b"):
                continue
            if not s.flags or command not in s.commands:
                missing.append(fl.name)
            elif s.kind == "boolean":
                given = (not value) if s.invert else value
                out.append(s.flag if given else f"--no-{s.flag[2:]}")
            else:
                out += [s.flag, _text(value)]
    return out, missing
