"""Repeated calibration rounds: when to stop measuring, and which figures the rounds disagree on.

A shared or virtual machine's speed drifts over seconds, so ``advisor calibrate`` measures every
figure in rounds spread over the run and keeps the median of each over all rounds
(fit.merge_rounds). After each round the ranks compute the relative spread of each key figure over
the last ``min_rounds`` rounds,

    spread = (max - min) / median          (over rounds; 0.10 = the rounds agree within 10%)

take the worst over figures and ranks (an all-reduce, so every rank takes the same decision), and
stop when

* the last ``min_rounds`` rounds agree: the worst spread over them is at most ``spread_target``
  (a window, not all rounds: max - min over all rounds never shrinks as rounds are added, so one
  disturbed round early on would otherwise keep the run going to its bound); or
* a bound is hit: ``max_rounds`` rounds, or the next round (timed like the last one) would end
  after ``budget_s`` seconds of measuring.

A figure whose rounds (all of them, as the median takes them) disagree by more than DISAGREEMENT
(20%) is named in a warning: the profile's ``notes: rounds:`` lists it and the command prints it on
stderr.

The key figures are the measurements each profile figure is derived from: the best matmul rate per
dtype (``peak_tflops``), the streaming bandwidth, the host time of the probe layer
(``launch_overhead_us``), the optimizer's per-tensor time and bytes per parameter, the element-wise
probe (``memory_efficiency``), per collective the time at the smallest and largest message on the
largest group (latency- and bandwidth-bound ends of its fit), and each pipeline schedule's step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

DISAGREEMENT = 0.20   # the bound (#12): a figure whose rounds disagree by more is named

# memory keys of a round -> the profile figure they feed (advisor.calibration.profile)
_MEMORY_FIGURES = (("bandwidth_gbps", "memory_bandwidth_gbps"),
                   ("layer_host_us", "launch_overhead_us (probe layer host time)"),
                   ("optimizer_us_per_tensor", "optimizer_overhead_us_per_tensor"),
                   ("optimizer_bytes_per_param", "optimizer_bytes_per_param"),
                   ("elementwise_probe_s", "memory_efficiency (element-wise probe time)"))


@dataclass(frozen=True)
class RoundRule:
    """When to stop repeating the measurements (module doc)."""
    min_rounds: int = 3
    max_rounds: int = 8
    spread_target: float = 0.10
    budget_s: float = 480.0       # of measuring; the launcher's own timeout (900 s by default) stays above it

    @staticmethod
    def quick() -> "RoundRule":
        return RoundRule(min_rounds=1, max_rounds=1)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def key_figures(one_round: dict[str, Any]) -> dict[str, float]:
    """The named figures of one round's measurements (module doc), where this rank measured them."""
    out: dict[str, float] = {}
    for dtype, points in (one_round.get("matmul") or {}).items():
        if points:
            out[f"peak_tflops {dtype}"] = max(rate for _, rate in points)
    memory = one_round.get("memory") or {}
    for key, name in _MEMORY_FIGURES:
        if memory.get(key) is not None:
            out[name] = memory[key]
    points = [p for p in (one_round.get("comm") or {}).get("points", []) if p.get("seconds") is not None]
    for op in dict.fromkeys(p["op"] for p in points):
        mine = [p for p in points if p["op"] == op]
        g = max(p["ranks"] for p in mine)
        sizes = sorted({p["bytes"] for p in mine if p["ranks"] == g})
        for nbytes in dict.fromkeys((sizes[0], sizes[-1])):
            (p,) = [p for p in mine if p["ranks"] == g and p["bytes"] == nbytes]
            out[f"{op} ({g} ranks, {_size(nbytes)})"] = p["seconds"]
    for name, probe in (one_round.get("pipeline") or {}).items():
        out[f"pipeline {name} step"] = probe["step_s"]
    return out


def relative_spread(values: list[float]) -> float:
    """(max - min) / median; 0 for a single value; inf when the median is not positive but values differ."""
    if len(values) < 2:
        return 0.0
    spread, mid = max(values) - min(values), statistics.median(values)
    if spread == 0:
        return 0.0
    return spread / mid if mid > 0 else math.inf


def figure_spreads(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Per key figure measured in every round, its relative spread over the rounds ({} below two
    rounds; a figure whose median is not positive has no relative spread and is left out)."""
    if len(rounds) < 2:
        return {}
    figures = [key_figures(r) for r in rounds]
    common = [name for name in figures[0] if all(name in f for f in figures[1:])]
    return {name: relative_spread([f[name] for f in figures]) for name in common
            if statistics.median(f[name] for f in figures) > 0}


def worst_spread(rounds: list[dict[str, Any]], window: int) -> float:
    """The largest spread of any key figure over the last ``window`` rounds; inf while fewer than
    ``window`` (or two) rounds are done."""
    if len(rounds) < window:
        return math.inf
    spreads = figure_spreads(rounds[-window:])
    return max(spreads.values()) if spreads else math.inf


def stop_reason(rounds_done: int, spread: float, elapsed_s: float, last_round_s: float, rule: RoundRule) -> str | None:
    """Why the measuring stops after ``rounds_done`` rounds (None: measure another round). ``spread``
    is the worst key figure's spread over the last ``min_rounds`` rounds of all ranks (worst_spread),
    ``elapsed_s`` the time measured so far."""
    if rounds_done >= rule.max_rounds:
        return f"the bound of {rounds_done} round{'s' if rounds_done > 1 else ''}"
    if rounds_done >= rule.min_rounds and spread <= rule.spread_target:
        return f"the last {rule.min_rounds} rounds agree within {spread:.0%} (target {rule.spread_target:.0%})"
    if rounds_done >= 1 and elapsed_s + last_round_s > rule.budget_s:
        return f"the time bound ({rule.budget_s:g} s): another round would end after {elapsed_s + last_round_s:.0f} s"
    return None


def rank_summary(rounds: list[dict[str, Any]], stopped: str | None, rule: RoundRule) -> dict[str, Any]:
    """What a rank reports about its rounds (JSON-safe), for ``summarize``."""
    return {"count": len(rounds), "stopped": stopped, "rule": rule_dict(rule),
            "spread": {name: round(v, 4) for name, v in figure_spreads(rounds).items()}}


def rule_dict(rule: RoundRule) -> dict[str, Any]:
    return {"min_rounds": rule.min_rounds, "max_rounds": rule.max_rounds, "spread_target": rule.spread_target,
            "budget_s": rule.budget_s}


def summarize(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile's ``notes: rounds:`` from each rank's ``rank_summary``: per figure the worst
    spread over the ranks, and a warning for each beyond DISAGREEMENT."""
    spreads: dict[str, float] = {}
    for info in per_rank:
        for name, value in (info.get("spread") or {}).items():
            spreads[name] = max(spreads.get(name, 0.0), value)
    count = per_rank[0]["count"]
    warnings = [f"{name}: the {count} calibration rounds disagree by {value:.0%} "
                f"((max - min) / median > {DISAGREEMENT:.0%}): unreliable"
                for name, value in sorted(spreads.items(), key=lambda kv: -kv[1]) if value > DISAGREEMENT]
    return {"count": count, "stopped": per_rank[0].get("stopped"), "rule": per_rank[0].get("rule"),
            "spread": spreads, "warnings": warnings}


def calibration_warnings(profile: dict[str, Any]) -> list[str]:
    """The warnings recorded in a calibrated profile (for the command to print)."""
    notes = profile.get("notes")
    rounds = notes.get("rounds") if isinstance(notes, dict) else None
    return list(rounds.get("warnings", [])) if isinstance(rounds, dict) else []
