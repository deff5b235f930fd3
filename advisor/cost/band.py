"""Error bands: how far a throughput prediction may be from the measurement, from the model's own record.

The band table (advisor/cost/error_bands.json) is written by ``python benchmarks/error_bands.py --write``
from leave-one-source-out residuals: each device's constants are refitted without one source at a time
(benchmarks/fit_profiles.py's targets) and that source's runs are predicted, so every residual is an
error on runs the fit did not see. A residual is e = predicted / measured - 1 of tokens per second.
For each such run the script counts the parts of its plan that lie outside what the other sources
cover (advisor.cost.confidence: a dtype, framework, parallelism or knob no other run uses, a cluster
size, sequence length or coverage range beyond theirs). From those:

* ``in_region``: per profile, the 10th and 90th percentiles of e over the runs with no such part (the
  runs of all devices pooled when a device has fewer than MIN_RUNS of them);
* ``first_part``: how much wider the 80% interval of |e| is for the runs with exactly one part outside
  their region (their 80th percentile of |e| less the in-region runs'); ``further_part``: what each
  further part adds over the runs with more (0 where they are no worse: on the bundled runs most of
  those are sizes or lengths just beyond the others', which cost little);
* ``pair``: the median of |e_a - e_b| over pairs of runs of one source with the same model and cluster
  size: the error of the model's comparison of two plans for one job, where the profile's shared error
  cancels. recommend ties plans closer than this (advisor.search.rank.TIE_BAND) and offers the simpler;
* ``memory``: the 10th and 90th percentiles of predicted / measured peak memory - 1 over the runs that
  publish a peak (torchtitan's tables, max reserved; held out of every fit). recommend requires a plan to
  fit at the band's upper end (memory_headroom: the share of memory it leaves free) unless the user gives
  --memory-margin; estimate judges the point figure and prints the band;
* ``coverage``: per profile, the plan-dependent ranges the runs span (ZeRO-3 shard group, data-parallel
  traffic over the compute it overlaps, MoE micro-batch tokens), which advisor.cost.confidence checks.

A plan with k parts outside the region has the band [lo - w(k), hi + w(k)], w(k) = first_part for the
first part and further_part for each other; its measured throughput is expected in
[predicted / (1 + hi'), predicted / (1 + lo')]. recommend ranks by the low end (the pessimistic one),
counting the parts that depend on the plan (the job's own, such as a cluster larger than any measured,
widen every plan's band alike). A profile without a calibration (no measured runs behind it) takes the pooled
residuals of runs outside their region (``uncalibrated``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

TABLE = Path(__file__).with_name("error_bands.json")
MIN_RUNS = 8          # in-region runs a profile needs for its own percentiles


@dataclass(frozen=True)
class Band:
    """Relative error interval of a prediction: predicted / measured - 1 expected in [low, high]."""

    low: float
    high: float
    parts: int          # parts of the plan outside the calibrated region (each widens the band)

    def tokens_per_s(self, predicted: float) -> tuple[float, float]:
        """The measured tokens/s the band expects: (pessimistic, optimistic)."""
        return predicted / (1.0 + self.high), predicted / max(1.0 + self.low, 1e-6)

    def to_dict(self, tokens_per_s: float, step_time_s: float, memory_gib: float) -> dict[str, Any]:
        """The plan JSON's ``prediction.band`` (docs/design.md): the measured figures the band expects, each
        [low, high], and what it rests on."""
        low, high = self.tokens_per_s(tokens_per_s)
        mem_low, mem_high = memory_band()
        return {"tokens_per_s": [low, high],
                "step_time_s": [step_time_s * max(1.0 + self.low, 1e-6), step_time_s * (1.0 + self.high)],
                "memory_gib": [memory_gib / (1.0 + mem_high), memory_gib / max(1.0 + mem_low, 1e-6)],
                "error": [self.low, self.high], "parts_outside": self.parts,
                "basis": "leave-one-source-out residuals (advisor/cost/error_bands.json); memory: torchtitan's "
                         "published peaks"}


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The bundled band table ({} when it has not been written)."""
    if not TABLE.is_file():
        return {}
    return json.loads(TABLE.read_text())


def coverage_of(profile: str) -> dict[str, Any]:
    """The plan-dependent ranges the measured runs of a profile span ({} when none)."""
    return dict(table().get("profiles", {}).get(profile, {}).get("coverage", {}))


def _base(profile: str) -> tuple[float, float]:
    t = table()
    entry = t.get("profiles", {}).get(profile)
    if entry is not None:
        return tuple(entry["in_region"])
    return tuple(t.get("uncalibrated", (0.0, 0.0)))      # no table: no band (python benchmarks/error_bands.py --write)


def widening(parts) -> np.ndarray | float:
    """w(k): how much a band widens for ``parts`` parts outside the calibrated region (array or int)."""
    t = table()
    k = np.asarray(parts, dtype=float)
    w = np.where(k > 0, float(t.get("first_part", 0.0)) + float(t.get("further_part", 0.0)) * np.maximum(k - 1, 0), 0.0)
    return float(w) if w.ndim == 0 else w


def memory_band() -> tuple[float, float]:
    """Predicted / measured peak memory - 1: its 10th and 90th percentiles over the runs that publish a peak
    (torchtitan's tables, held out of every fit); (0, 0) without a table."""
    return tuple(table().get("memory", (0.0, 0.0)))


def memory_headroom() -> float:
    """The share of each device's memory a recommended plan leaves free so that it fits at the upper end of
    its memory band: a measured peak up to predicted / (1 + low) fits when predicted <= (1 + low) x the
    device, i.e. a margin of -low (0 without a table, or where the model over-predicts every peak).
    recommend and whatif use it as the memory margin unless --memory-margin is given (docs/commands.md)."""
    low, _ = memory_band()
    return round(max(-float(low), 0.0), 4)


def band(profile: str, parts: int) -> Band:
    """The band of a prediction on ``profile`` with ``parts`` parts outside the calibrated region."""
    low, high = _base(profile)
    w = widening(parts)
    return Band(low - w, high + w, int(parts))


def pessimistic_factor(profile: str, parts) -> np.ndarray:
    """Each candidate's pessimistic throughput over its predicted one: 1 / (1 + the band's high end)."""
    _, high = _base(profile)
    return 1.0 / (1.0 + high + widening(parts))
