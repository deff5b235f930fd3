"""Fit a device's physical constants to measured runs.

A device is fitted on every measured run that ran on it (benchmarks/data/calibration_runs.yaml, and
for A100 the Megatron-LM papers' runs) by moving only physical constants, never a per-run
correction (benchmarks/fit_profiles.py prints the fits and the profiles carry the result):

* ``gemm_scale.<dtype>``: a scale on the dtype's GEMM efficiency curve (the achievable fraction of
  peak); ``gemm_shift``: a shift of the curves along their size axis (log10 GFLOP: how much work a
  GEMM needs before tile and launch costs stop mattering), shared by the dtypes;
* ``attention_scale.<kernel>``: a scale on a fused attention kernel's efficiency curve;
* ``memory_efficiency``: the achievable fraction of memory bandwidth of memory-bound kernels;
* ``launch_overhead_us``: the host's time per kernel launch;
* ``inter_efficiency`` / ``intra_efficiency``: the fraction of link bandwidth collectives reach.

The curves' shapes are the starting values of benchmarks/data/starting_curves.yaml. The objective is
the log of predicted over measured throughput (or iteration time), each run weighted by
1/sqrt(runs of its source) so that every source counts about the same, with a soft-L1 loss (runs
more than ~10% off count linearly, not quadratically) and a weak pull of every constant toward its
starting value (a prior, weight PRIOR_WEIGHT) so that constants the runs do not determine stay where
the vendor figures put them. scipy.optimize.least_squares, bounded.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from scipy.optimize import least_squares

from advisor.specs.hardware import HardwareProfile, hardware_from_dict, load_hardware

SHAPES_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "starting_curves.yaml"
PRIOR_WEIGHT = 0.05
LOSS_SCALE = 0.10


@dataclass(frozen=True)
class Constant:
    """One free physical constant: its starting value and bounds."""

    name: str
    start: float
    low: float
    high: float
    log: bool = True        # the prior pulls log(value / start) (scales); False: (value - start) / (high - low)


@dataclass(frozen=True)
class Target:
    """A device to fit: the profiles that share its constants, its curve shapes and constants."""

    device: str
    profiles: tuple[str, ...]
    gemm_shape: str
    attention_shapes: dict[str, str]
    constants: tuple[Constant, ...]
    fp8: bool = False
    fixed: dict[str, float] = field(default_factory=dict)


@lru_cache(maxsize=1)
def shapes() -> dict[str, list[list[float]]]:
    return yaml.safe_load(SHAPES_FILE.read_text())["shapes"]


def _curve(points, scale: float, size_factor: float = 1.0) -> list[list[float]]:
    return [[float(f"{x * size_factor:.6g}"), float(f"{min(y * scale, 1.0):.4g}")] for x, y in points]


def profile_raw(target: Target, base_raw: dict[str, Any], values: dict[str, float]) -> dict[str, Any]:
    """The profile mapping with the device's constants set to `values` (missing ones: start)."""
    v = {c.name: c.start for c in target.constants}
    v.update(target.fixed)
    v.update(values)
    raw = copy.deepcopy(base_raw)
    dev = raw["device"]
    shift = 10.0 ** v.get("gemm_shift", 0.0)
    gemm = shapes()[target.gemm_shape]
    curves = {"bf16": _curve(gemm, v.get("gemm_scale.bf16", 1.0), shift)}
    if target.fp8:
        curves["fp8"] = _curve(gemm, v.get("gemm_scale.fp8", 1.0), 2.0 * shift)
    dev["matmul_efficiency"] = curves
    dev["attention_efficiency"] = {kernel: _curve(shapes()[shape], v.get(f"attention_scale.{kernel}", 1.0))
                                   for kernel, shape in target.attention_shapes.items()}
    if "memory_efficiency" in v:
        dev["memory_efficiency"] = float(f"{v['memory_efficiency']:.4g}")
    if "launch_overhead_us" in v:
        dev["launch_overhead_us"] = float(f"{v['launch_overhead_us']:.4g}")
    if "inter_efficiency" in v:
        raw["inter_node"]["efficiency"] = float(f"{v['inter_efficiency']:.4g}")
    if "intra_efficiency" in v:
        raw["node"]["intra_node"]["efficiency"] = float(f"{v['intra_efficiency']:.4g}")
    return raw


def profile(target: Target, name: str, values: dict[str, float]) -> HardwareProfile:
    base = load_hardware(name).raw
    return hardware_from_dict(profile_raw(target, base, values), f"{name} (fit)")


@dataclass(frozen=True)
class Observation:
    """One measured figure: a source label and a function of the profile returning log(pred/meas)."""

    source: str
    profile: str
    log_error: Callable[[HardwareProfile], float]


@dataclass(frozen=True)
class FitResult:
    target: Target
    values: dict[str, float]
    errors: dict[str, list[float]]          # source -> relative errors (pred / meas - 1) at the fit
    evaluations: int


def _weights(observations: list[Observation]) -> np.ndarray:
    counts = Counter(o.source for o in observations)
    return np.array([1.0 / math.sqrt(counts[o.source]) for o in observations])


def evaluate(target: Target, observations: list[Observation], values: dict[str, float]) -> dict[str, list[float]]:
    """Relative errors per source under the given constants."""
    profiles = {name: profile(target, name, values) for name in {o.profile for o in observations}}
    out: dict[str, list[float]] = {}
    for o in observations:
        out.setdefault(o.source, []).append(math.expm1(o.log_error(profiles[o.profile])))
    return out


def fit(target: Target, observations: list[Observation], max_evaluations: int = 60) -> FitResult:
    """Least-squares fit of the target's constants to the observations (see the module docstring)."""
    names = [c.name for c in target.constants]
    start = np.array([c.start for c in target.constants])
    low = np.array([c.low for c in target.constants])
    high = np.array([c.high for c in target.constants])
    weights = _weights(observations)
    count = [0]

    def residuals(x):
        count[0] += 1
        values = dict(zip(names, x))
        profiles = {name: profile(target, name, values) for name in {o.profile for o in observations}}
        r = np.array([o.log_error(profiles[o.profile]) for o in observations]) * weights
        prior = np.array([math.log(v / c.start) if c.log else (v - c.start) / (c.high - c.low)
                          for v, c in zip(x, target.constants)]) * PRIOR_WEIGHT
        return np.concatenate([r, prior])

    result = least_squares(residuals, start, bounds=(low, high), loss="soft_l1", f_scale=LOSS_SCALE,
                           x_scale="jac", max_nfev=max_evaluations, diff_step=1e-3)
    values = dict(zip(names, (float(x) for x in result.x)))
    return FitResult(target, values, evaluate(target, observations, values), count[0])
