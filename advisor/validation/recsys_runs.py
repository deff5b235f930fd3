"""Published DLRM throughput (advisor/validation/recsys_runs.yaml) against the recommendation cost
model: each run's prediction in the sharded (hybrid-parallel, all-to-all) mode it was measured in."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from advisor.cost.recsys import RecsysConfig
from advisor.cost.recsys_estimate import estimate_recsys
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

RUNS_FILE = Path(__file__).with_name("recsys_runs.yaml")
LARGE = "dlrm-criteo-1tb"


@dataclass(frozen=True)
class RecsysCheck:
    label: str
    measured_samples_per_s: float
    predicted_samples_per_s: float
    bottleneck: str

    @property
    def ratio(self) -> float:
        """Predicted over measured (above 1: the model is optimistic)."""
        return self.predicted_samples_per_s / self.measured_samples_per_s


def checks(path: Path = RUNS_FILE) -> list[RecsysCheck]:
    data = yaml.safe_load(path.read_text())
    large = load_model(LARGE)
    rows = data["small_table_rows"]
    small = replace(large, name="dlrm-criteo-1tb-fl15",
                    tables=tuple(replace(t, rows=r) for t, r in zip(large.tables, rows, strict=True)))
    out = []
    for run in data["runs"]:
        hw = load_hardware(run["hardware"])
        cluster = Cluster.of(hw, devices=run["devices"])
        job = TrainingJob(global_batch_size=run["batch_per_device"] * run["devices"], seq_length=1,
                          dtype=run["dtype"], optimizer="sgd")
        model = large if run["model"] == "large" else small
        e = estimate_recsys(model, hw, cluster, job, RecsysConfig("sharded"))
        label = f"{run['hardware']} x{run['devices']} {run['model']} {run['dtype']}"
        out.append(RecsysCheck(label, float(run["samples_per_s"]), e.samples_per_s, e.bottleneck))
    return out
