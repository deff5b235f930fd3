"""Fit a device's physical constants to measured runs.

A device is fitted on every measured run that ran on it (benchmarks/data/calibration_runs.yaml, and
for A100 the Megatron-LM papers' runs) by moving only physical constants, never a per-run
correction (benchmarks/fit_profiles.py prints the fits and the profiles carry the result):

* ``gemm_scale.<dtype>``: a scale on the dtype's GEMM efficiency curve (the achievable fraction of
  peak); ``gemm_size_factor``: a factor on the curves' size axis (GFLOP: how much work a GEMM needs
  before tile and launch costs stop mattering), shared by the dtypes;
* ``attention_scale.<kernel>``: a scale on a fused attention kernel's efficiency curve;
* ``memory_efficiency``: the achievable fraction of memory bandwidth of memory-bound kernels;
* ``launch_overhead_us``: the host's time per kernel launch;
* ``inter_efficiency`` / ``intra_efficiency``: the fraction of link bandwidth collectives reach.

Profiles of one GPU in different systems (B200 in DGX B200 and in GB200 NVL72) are fitted together
on all their runs: the GPU's constants are shared, a constant named ``key@profile`` is one system's
own (its host's launch overhead), and the size factor is relative to each profile's ``size_base``.

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
from advisor import bundled_yaml

SHAPES_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "starting_curves.yaml"
# Method choices (not physical constants): the prior's weight against one run's log error (a run
# 5% off weighs as much as a constant moved by its full starting value), the error beyond which the
# soft-L1 loss turns linear (10%, the accuracy goal), and the finite-difference step relative
# to each constant (0.1%: well above the model's float noise, well below any constant's effect).
PRIOR_WEIGHT = 0.05
LOSS_SCALE = 0.10
DIFF_STEP = 1e-3
# "launch_overhead_us@dgx-b200": a constant of one profile of a target that fits several together
PROFILE_SEPARATOR = "@"


@dataclass(frozen=True)
class Constant:
    """One free physical constant: its starting value (or a function giving it, read when a fit starts:
    another device's fitted value) and bounds."""

    name: str
    start: float | Callable[[], float]
    low: float
    high: float
    log: bool = True        # the prior pulls log(value / start) (scales); False: (value - start) / (high - low)

    def initial(self) -> float:
        """The starting value, within the bounds (a start read from another fit may sit on, or round
        just past, one)."""
        value = float(self.start()) if callable(self.start) else float(self.start)
        return min(max(value, self.low), self.high)


@dataclass(frozen=True)
class Target:
    """A device to fit: its profiles (sharing its constants, but for those named "key@profile"), its
    curve shapes and constants."""

    device: str
    profiles: tuple[str, ...]
    gemm_shape: str
    attention_shapes: dict[str, str]
    constants: tuple[Constant, ...]
    fp8: bool = False
    # constants held, not fitted: a value, or a function giving it from another fitted profile
    fixed: dict[str, float | Callable[[], float]] = field(default_factory=dict)
    # profile -> the value its gemm_size_factor is relative to (profiles of one GPU whose peaks differ,
    # fitted together); a profile not named takes the factor as it is
    size_base: dict[str, Callable[[], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owners = {c.name.partition(PROFILE_SEPARATOR)[2] for c in self.constants} - {""}
        for name in sorted((owners | set(self.size_base)) - set(self.profiles)):
            raise ValueError(f"fit target {self.device}: a constant or size base names profile {name!r}, "
                             f"which is not one of its profiles {self.profiles}")


def resolve_fixed(target: Target) -> dict[str, float]:
    """The target's held constants as values (functions are evaluated now)."""
    return {k: (v() if callable(v) else float(v)) for k, v in target.fixed.items()}


@lru_cache(maxsize=1)
def shapes() -> dict[str, list[list[float]]]:
    return bundled_yaml.load(SHAPES_FILE)["shapes"]


def _curve(points, scale: float, size_factor: float = 1.0) -> list[list[float]]:
    """A starting shape scaled (efficiency capped at 1) and stretched along its size axis; not
    rounded, so that the objective moves continuously (advisor.validation.write rounds the file)."""
    return [[x * size_factor, min(y * scale, 1.0)] for x, y in points]


def shape_scale(profile_name: str, dtype: str, shape: str) -> float:
    """The GEMM scale a bundled profile's curve carries over a starting shape (its best point over
    the shape's): how another device's fit reuses it."""
    curve = load_hardware(profile_name).device.gemm_curve(dtype)
    return max(y for _, y in curve) / max(y for _, y in shapes()[shape])


def profile_values(target: Target, profile: str, values: dict[str, float],
                   fixed: dict[str, float] | None = None) -> dict[str, float]:
    """The constants one of the target's profiles takes: the starting values, the held ones (`fixed`;
    None: resolved now) and `values`, the profile's own ("key@profile") over the shared ones, and the
    size factor times the profile's size base."""
    v = {c.name: c.initial() for c in target.constants if c.name not in values}
    v.update(resolve_fixed(target) if fixed is None else fixed)
    v.update(values)
    out = {k: x for k, x in v.items() if PROFILE_SEPARATOR not in k}
    for k, x in v.items():
        key, separator, owner = k.partition(PROFILE_SEPARATOR)
        if separator and owner == profile:
            out[key] = x
    base = target.size_base.get(profile)
    if base is not None:
        out["gemm_size_factor"] = out.get("gemm_size_factor", 1.0) * base()
    return out


def profile_raw(target: Target, profile: str, base_raw: dict[str, Any], values: dict[str, float],
                fixed: dict[str, float] | None = None) -> dict[str, Any]:
    """The mapping of the target's profile `profile` with its constants set (profile_values)."""
    v = profile_values(target, profile, values, fixed)
    raw = copy.deepcopy(base_raw)
    dev = raw["device"]
    size = v.get("gemm_size_factor", 1.0)
    gemm = shapes()[target.gemm_shape]
    curves = {"bf16": _curve(gemm, v.get("gemm_scale.bf16", 1.0), size)}
    if target.fp8:
        # FP8 GEMMs need twice the work per call for the same fixed costs (starting_curves.yaml)
        curves["fp8"] = _curve(gemm, v.get("gemm_scale.fp8", 1.0), 2.0 * size)
    dev["matmul_efficiency"] = curves
    dev["attention_efficiency"] = {kernel: _curve(shapes()[shape], v.get(f"attention_scale.{kernel}", 1.0))
                                   for kernel, shape in target.attention_shapes.items()}
    for key in ("memory_efficiency", "launch_overhead_us"):
        if key in v:
            dev[key] = v[key]
    if "inter_efficiency" in v:
        raw["inter_node"]["efficiency"] = v["inter_efficiency"]
    if "intra_efficiency" in v:
        raw["node"]["intra_node"]["efficiency"] = v["intra_efficiency"]
    return raw


def _profiles(target: Target, names, values: dict[str, float], fixed: dict[str, float],
              bases: dict[str, dict[str, Any]]) -> dict[str, HardwareProfile]:
    return {name: hardware_from_dict(profile_raw(target, name, bases[name], values, fixed), f"{name} (fit)") for name in names}


def _bases(observations) -> dict[str, dict[str, Any]]:
    return {name: load_hardware(name).raw for name in {o.profile for o in observations}}


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
    fixed: dict[str, float]                 # the held constants the fit used


def _weights(observations: list[Observation]) -> np.ndarray:
    counts = Counter(o.source for o in observations)
    return np.array([1.0 / math.sqrt(counts[o.source]) for o in observations])


def evaluate(target: Target, observations: list[Observation], values: dict[str, float],
             fixed: dict[str, float] | None = None) -> dict[str, list[float]]:
    """Relative errors per source under the given constants."""
    fixed = resolve_fixed(target) if fixed is None else fixed
    profiles = _profiles(target, {o.profile for o in observations}, values, fixed, _bases(observations))
    out: dict[str, list[float]] = {}
    for o in observations:
        out.setdefault(o.source, []).append(math.expm1(o.log_error(profiles[o.profile])))
    return out


def fit(target: Target, observations: list[Observation], max_evaluations: int = 60) -> FitResult:
    """Least-squares fit of the target's constants to the observations (see the module docstring)."""
    names = [c.name for c in target.constants]
    low = np.array([c.low for c in target.constants])
    high = np.array([c.high for c in target.constants])
    start = np.array([c.initial() for c in target.constants])
    weights = _weights(observations)
    fixed, bases = resolve_fixed(target), _bases(observations)
    count = [0]

    def residuals(x):
        count[0] += 1
        values = dict(zip(names, x))
        profiles = _profiles(target, bases, values, fixed, bases)
        r = np.array([o.log_error(profiles[o.profile]) for o in observations]) * weights
        prior = np.array([math.log(v / s) if c.log else (v - s) / (c.high - c.low)
                          for v, s, c in zip(x, start, target.constants)]) * PRIOR_WEIGHT
        return np.concatenate([r, prior])

    result = least_squares(residuals, start, bounds=(low, high), loss="soft_l1", f_scale=LOSS_SCALE,
                           x_scale="jac", max_nfev=max_evaluations, diff_step=DIFF_STEP)
    values = dict(zip(names, (float(x) for x in result.x)))
    return FitResult(target, values, evaluate(target, observations, values, fixed), count[0], fixed)
