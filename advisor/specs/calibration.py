"""A fitted profile's calibrated region (the top-level ``calibration:`` mapping that
benchmarks/fit_profiles.py writes): the measured runs behind its constants and what they covered.
advisor.cost.confidence reads it to say where an estimate extrapolates."""

from __future__ import annotations

from typing import Any

from advisor.errors import AdvisorError

LISTS = ("sources", "dtypes", "frameworks", "attention_kernels", "parallelism", "framework_parallelism", "models")
RANGES = ("seq_length", "devices")
KEYS = ("runs",) + LISTS + RANGES


def check_calibration(value: Any, origin: str) -> dict[str, Any] | None:
    """The mapping, validated (None when absent): runs a positive integer, the lists lists of names,
    the ranges [low, high] pairs of positive integers."""
    if value is None:
        return None
    where = f"{origin}: key 'calibration'"
    if not isinstance(value, dict) or "runs" not in value or not set(value) <= set(KEYS):
        raise AdvisorError(f"{where} must be a mapping with runs and any of {', '.join(KEYS[1:])} "
                           f"(written by benchmarks/fit_profiles.py), got {str(value)[:80]!r}")
    runs = value["runs"]
    if isinstance(runs, bool) or not isinstance(runs, int) or runs <= 0:
        raise AdvisorError(f"{where}: 'runs' must be a positive integer, got {str(runs)[:40]!r}")
    for key in LISTS:
        items = value.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise AdvisorError(f"{where}: '{key}' must be a list of names, got {str(items)[:80]!r}")
    for key in RANGES:
        pair = value.get(key, [0, 0])
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair) or pair[0] > pair[1]):
            raise AdvisorError(f"{where}: '{key}' must be [low, high] integers, got {str(pair)[:80]!r}")
    return value
