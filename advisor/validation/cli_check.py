"""Every measured run advisor.validation prices, entered on advisor's own command line: the flags its settings
records give (advisor.commands.cli_words), the model written as a model YAML, run through ``advisor estimate
--json`` in this process. A run is "as priced" when the command line accepts it and prints the validation's
tokens/s; otherwise the refusal or the setting without a flag is what a user could not enter.

    from advisor.validation.cli_check import check_all
    results = check_all()           # CliCheck per usable calibration and published run
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from advisor.space.strategy import Strategy
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec, model_to_dict


@dataclass(frozen=True)
class CliCheck:
    run_id: str
    words: tuple[str, ...]
    """The command line's settings flags."""
    validation_tokens_per_s: float
    cli_tokens_per_s: float | None
    """None: not accepted (refused, or a setting the command line has no flag for)."""
    why: str | None
    """The refusal, or the settings without a flag."""

    @property
    def as_priced(self) -> bool:
        return self.cli_tokens_per_s is not None and abs(self.cli_tokens_per_s / self.validation_tokens_per_s - 1) < 1e-9


def check(run_id: str, model: ModelSpec, profile: str, devices: int, job: TrainingJob, strategy: Strategy,
          tokens_per_s: float, folder: Path) -> CliCheck:
    from typer.testing import CliRunner

    from advisor.cli import app
    from advisor.commands.cli_words import words

    flags, missing = words("estimate", job, strategy, model.num_layers)
    if missing:
        return CliCheck(run_id, tuple(flags), tokens_per_s, None, "no flag for " + ", ".join(missing))
    path = folder / "model.yaml"
    path.write_text(yaml.safe_dump(model_to_dict(model), sort_keys=False))
    result = CliRunner().invoke(app, ["estimate", "--model", str(path), "--hardware", profile, "--devices",
                                      str(devices), *flags, "--json"])
    if result.exit_code != 0:
        said = getattr(result, "stderr", "") or result.output or repr(result.exception)
        return CliCheck(run_id, tuple(flags), tokens_per_s, None, " ".join(said.split())[-300:])
    return CliCheck(run_id, tuple(flags), tokens_per_s, json.loads(result.stdout)["tokens_per_s"], None)


def check_all() -> list[CliCheck]:
    """The usable calibration runs (advisor.validation.runs) and the published runs (their best candidate layout,
    as advisor.validation.published prices them)."""
    from advisor.specs.job import Cluster
    from advisor.specs.hardware import load_hardware
    from advisor.cost.estimate import estimate
    from advisor.validation.accuracy import predict, usable_runs
    from advisor.validation.published import load_published_runs
    from advisor.validation.published import predict as predict_published

    out = []
    with tempfile.TemporaryDirectory() as folder:
        for run in usable_runs():
            p = predict(run)
            out.append(check(run.id, run.model, run.profile, run.devices, run.job, run.strategy,
                             p.predicted_tokens_per_s_per_device * run.devices, Path(folder)))
        for run in load_published_runs():
            s = predict_published(run).strategy
            hw = load_hardware(run.hardware)
            e = estimate(run.model, hw, Cluster.of(hw, devices=run.devices), run.job, s)
            out.append(check(run.id, run.model, run.hardware, run.devices, run.job, s, e.tokens_per_s, Path(folder)))
    return out
