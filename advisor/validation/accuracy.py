"""The cost model's error on the calibration set: per run, per source and device, per feature.

Throughput is compared as tokens per second per device, which every source publishes (or, for one
Megatron-Bridge row, its model TFLOP/s under the same FLOP convention); FLOP conventions differ
between sources, tokens do not. MAPE = mean over runs of |predicted / measured - 1|.
"""

from __future__ import annotations

import copy
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from advisor.cost.estimate import estimate
from advisor.specs.hardware import HardwareProfile, hardware_from_dict
from advisor.specs.job import Cluster
from advisor.validation.runs import CalibrationRun, bundled_profile, load_runs


@dataclass(frozen=True)
class RunPrediction:
    run: CalibrationRun
    predicted_tokens_per_s_per_device: float
    fits: bool
    memory_gib: float
    mfu: float

    @property
    def error(self) -> float:
        """predicted / measured - 1 (positive: predicted too fast)."""
        return self.predicted_tokens_per_s_per_device / self.run.measured_tokens_per_s_per_device - 1.0

    @property
    def memory_error(self) -> float | None:
        """predicted / measured peak memory - 1, where the source publishes it."""
        measured = self.run.measured_peak_memory_gib
        return None if measured is None else self.memory_gib / measured - 1.0


def run_hardware(run: CalibrationRun) -> HardwareProfile:
    """The bundled profile of the run's machine, with the device fields it differs in."""
    hw = bundled_profile(run.profile)
    if not run.hardware_overrides:
        return hw
    raw = copy.deepcopy(hw.raw)
    raw["device"].update(dict(run.hardware_overrides))
    return hardware_from_dict(raw, f"{run.profile} as run by {run.id}")


def predict(run: CalibrationRun, hardware: HardwareProfile | None = None) -> RunPrediction:
    hw = hardware or run_hardware(run)
    cluster = Cluster.of(hw, devices=run.devices)
    e = estimate(run.model, hw, cluster, run.job, run.strategy)
    return RunPrediction(run=run, predicted_tokens_per_s_per_device=e.tokens_per_s_per_device,
                         fits=e.memory_gib.total <= hw.device.memory_gib, memory_gib=e.memory_gib.total, mfu=e.mfu)


def usable_runs(runs: Iterable[CalibrationRun] | None = None) -> list[CalibrationRun]:
    return [r for r in (load_runs() if runs is None else runs) if r.excluded is None]


def predictions(runs: Iterable[CalibrationRun] | None = None,
                hardware_for: Callable[[CalibrationRun], HardwareProfile] | None = None) -> list[RunPrediction]:
    return [predict(r, hardware_for(r) if hardware_for else None) for r in usable_runs(runs)]


def mape(preds: Iterable[RunPrediction]) -> float:
    errors = [abs(p.error) for p in preds]
    return statistics.mean(errors) if errors else float("nan")


def by_group(preds: Iterable[RunPrediction]) -> dict[str, list[RunPrediction]]:
    out: dict[str, list[RunPrediction]] = defaultdict(list)
    for p in preds:
        out[p.run.group].append(p)
    return dict(sorted(out.items()))


def by_feature(preds: Iterable[RunPrediction]) -> dict[str, list[RunPrediction]]:
    out: dict[str, list[RunPrediction]] = defaultdict(list)
    for p in preds:
        for feature in p.run.features:
            out[feature].append(p)
    return dict(sorted(out.items()))
