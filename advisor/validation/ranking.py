"""Does the cost model order measured runs as they measured? Kendall tau inside each llm-foundry table.

An llm-foundry table (one hardware and precision) lists, for each model and GPU count, runs that
differ in sequence length, micro-batch and global batch. Inside such a group (same table, model and
devices: what a user comparing their options would compare) the predicted tokens per second per
device should rank the runs as measured. Groups with fewer than MIN_RUNS runs are not scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from scipy.stats import kendalltau

from advisor.validation.accuracy import RunPrediction

MIN_RUNS = 3      # the fewest runs whose order says something (Kendall tau of 2 is +-1)


@dataclass(frozen=True)
class TableRanking:
    table: str
    model: str
    devices: int
    runs: int
    kendall_tau: float


def _table(run_id: str) -> str:
    """'foundry-a100-80g-mpt-7b-s2048-...' -> 'a100-80g'; 'foundry-h100-bf16-large-...' -> 'h100-bf16-large'."""
    parts = run_id.split("-")
    head = parts[1:parts.index("mpt")]
    return "-".join(head)


def foundry_rankings(preds: Iterable[RunPrediction]) -> list[TableRanking]:
    groups: dict[tuple[str, str, int], list[RunPrediction]] = {}
    for p in preds:
        if p.run.source != "llm-foundry":
            continue
        groups.setdefault((_table(p.run.id), p.run.model.name, p.run.devices), []).append(p)
    out = []
    for (table, model, devices), ps in sorted(groups.items()):
        if len(ps) < MIN_RUNS:
            continue
        measured = [p.run.measured_tokens_per_s_per_device for p in ps]
        predicted = [p.predicted_tokens_per_s_per_device for p in ps]
        tau = float(kendalltau(measured, predicted).statistic)
        out.append(TableRanking(table, model, devices, len(ps), tau))
    return out
