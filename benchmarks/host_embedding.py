"""The word embedding on the host (MindSpore Host&Device training) in the cost model and the search
(prints figures; not a test).

    python benchmarks/host_embedding.py

1. One plan, llama3-8b on 8 Ascend 910B, ZeRO-1 without recomputation or optimizer offload: device
   memory, host memory and step time with the table on the device and on the host, and what the
   host adds (per micro-batch on the first stage, per step).
2. For untied models on Ascend 910B with --framework mindspore: the enumerator's best plan with the
   option searched, pinned on (--host-embedding) and pinned off, and how often it is in the top 5.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.cost.estimate import estimate, estimate_batch  # noqa: E402
from advisor.cost.host_embedding import host_embedding  # noqa: E402
from advisor.cost.placement import placements  # noqa: E402
from advisor.commands.inputs import resolve_inputs  # noqa: E402
from advisor.search import Pins  # noqa: E402
from advisor.search.enumerate import search  # noqa: E402
from advisor.space.strategy import Strategy, StrategyBatch  # noqa: E402

CASES = [("llama3-8b", 8, 64, 4096), ("llama3-8b", 64, 512, 4096), ("llama3-70b", 64, 128, 4096),
         ("llama2-13b", 8, 64, 4096)]


def one_plan() -> None:
    i = resolve_inputs("llama3-8b", "ascend-910b", devices=8, global_batch_size=64, seq_length=4096, framework="mindspore")
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=8, zero_stage=1)
    print("== llama3-8b, 8 x Ascend 910B, batch 64 x 4096, dp 8, ZeRO-1, no recomputation, no optimizer offload")
    for hosted in (False, True):
        e = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, host_embedding=hosted))
        print(f"   table on the {'host  ' if hosted else 'device'}  device {e.memory_gib.total:6.2f} GiB of "
              f"{e.capacity_gib:g} ({'fits' if e.feasible else 'does not fit'})  host {e.host_embedding_gib:5.2f} GiB  "
              f"step {e.step_time_s:6.3f} s  {e.tokens_per_s:8,.0f} tokens/s  offload part {e.time_s['offload']:.3f} s")
    b = StrategyBatch.from_strategies([replace(s, host_embedding=True)], i.model.num_layers)
    groups = placements(i.hardware, b, ("dp_cp", "pp"))
    parts = host_embedding(i.model, i.hardware, i.job, b, groups["dp_cp"], groups["pp"])
    print(f"   host parts: {parts.micro_batch_s[0] * 1e3:.1f} ms per micro-batch (lookup, PCIe both ways, "
          f"scatter-add) x {s.num_micro_batches}; {parts.step_s[0]:.3f} s per step (gradient exchange, host Adam)")


def searches() -> None:
    print("\n== enumerator's best on Ascend 910B, --framework mindspore: searched / pinned on / pinned off")
    for name, devices, gbs, seq in CASES:
        i = resolve_inputs(name, "ascend-910b", devices=devices, global_batch_size=gbs, seq_length=seq, framework="mindspore")
        row = []
        for pins in (Pins(), Pins(host_embedding=True), Pins(host_embedding=False)):
            t0 = time.perf_counter()
            out = search(i.model, i.hardware, i.cluster, i.job, pins, top_k=5)
            took = time.perf_counter() - t0
            if not len(out.finalists):
                row.append("none fits")
                continue
            # the fastest finalist (the finalists come in the order the search scored them)
            best = int(np.argmax(estimate_batch(i.model, i.hardware, i.cluster, i.job, out.finalists).tokens_per_s))
            e = estimate(i.model, i.hardware, i.cluster, i.job, out.finalists.strategy(best))
            hosted = int(out.finalists.host_embedding.sum())
            row.append(f"{e.tokens_per_s:9,.0f} tok/s ({hosted}/{len(out.finalists)} hosted, {took:.2f} s)")
        print(f"   {name:11s} {devices:4d} dev  " + "  |  ".join(row))


if __name__ == "__main__":
    one_plan()
    searches()
