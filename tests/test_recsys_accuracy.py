"""The recommendation cost model against published DLRM training throughput (held out: nothing was
fitted to it; advisor/validation/recsys_runs.yaml names the source table and row of each figure)."""

from __future__ import annotations

import math

import pytest

from advisor.validation.recsys_runs import checks

CHECKS = checks()
# The project's rule: a plan predicted 2x too fast is worse than no plan.
RULE = 2.0
TARGET = 0.35


def test_every_published_run_is_priced_and_feasible():
    assert len(CHECKS) == 10
    assert all(c.predicted_samples_per_s > 0 for c in CHECKS)


@pytest.mark.parametrize("check", CHECKS, ids=[c.label for c in CHECKS])
def test_never_twice_too_fast_nor_twice_too_slow(check):
    assert 1 / RULE < check.ratio < RULE, f"{check.label}: predicted/measured {check.ratio:.2f}"


def test_errors_overall():
    ratios = [c.ratio for c in CHECKS]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    # optimistic on average (the model prices no framework or input-pipeline overhead), within 35%
    assert 1.0 < geomean < 1 + TARGET, geomean
    assert sum(abs(r - 1) <= TARGET for r in ratios) >= 6, ratios


@pytest.mark.xfail(strict=True, reason="known gap: multi-GPU fp16 runs predicted 1.45-1.96x too fast "
                                       "(benchmarks/parameter_server.py lists every error)")
def test_every_run_within_35_percent():
    assert all(abs(c.ratio - 1) <= TARGET for c in CHECKS), [(c.label, round(c.ratio, 2)) for c in CHECKS]
