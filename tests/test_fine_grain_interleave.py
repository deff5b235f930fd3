"""Tensor-parallel overlap: Transformer Engine's tp chunks and MindFormers' fine_grain_interleave slices
(advisor.cost.layer_comm), and the MindFormers rows that set it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.cost.estimate import estimate
from advisor.cost.layer_comm import FINE_GRAIN_SLICES
from advisor.cost.overlap_slowdown import OVERLAP_COMPUTE_SLOWDOWN
from advisor.space.strategy import Strategy
from advisor.validation.runs import load_runs


@pytest.mark.parametrize("framework,exposed_share", [("megatron", 1 / 8), ("mindspore", 1 / FINE_GRAIN_SLICES)])
def test_one_chunk_or_slice_stays_exposed(framework, exposed_share):
    """Where the layer's GEMMs cover the rest (llama3-70b, tp 8 over NVLink), what stays exposed is one
    of tp chunks (TE's ring exchange) or one of the sequence slices (MindFormers); the hidden rest slows the
    GEMMs it runs under by OVERLAP_COMPUTE_SLOWDOWN of its seconds (Lee et al. 2025), booked with tp_comm."""
    i = resolve_inputs("llama3-70b", "dgx-h100", devices=64, framework=framework)
    s = Strategy(dp=8, tp=8, pp=1, micro_batch_size=1, num_micro_batches=i.job.global_batch_size // 8, zero_stage=1,
                 sequence_parallel=True)
    plain = estimate(i.model, i.hardware, i.cluster, i.job, s).time_s["tp_comm"]
    overlapped = estimate(i.model, i.hardware, i.cluster, replace(i.job, tp_comm_overlap=True), s).time_s["tp_comm"]
    assert plain > 0
    slowed = OVERLAP_COMPUTE_SLOWDOWN * (1.0 - exposed_share)
    assert overlapped / plain == pytest.approx(exposed_share + slowed, rel=1e-9)


def test_mindformers_rows_with_fine_grain_interleave_overlap_their_tp_collectives():
    overlapped = {r.id for r in load_runs() if r.source == "MindFormers" and r.job.tp_comm_overlap}
    assert {"mindformers-yi-34b-atlas-800t-a2", "mindformers-codellama-34b-atlas-800t-a2",
            "mindformers-qwen2-0.5b-atlas-900-a2-podc"} <= overlapped
    assert "mindformers-qwen2-1.5b-atlas-900-a2-podc" not in overlapped      # its yaml sets 1
