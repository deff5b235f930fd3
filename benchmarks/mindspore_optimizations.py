"""Communication fusion and multi-copy parallelism in the search (prints figures; not a test).

    python benchmarks/mindspore_optimizations.py [--repeat 3]

For each case and framework: the enumerator's finalists (advisor.search.enumerate, default knobs),
then advisor.search.comm_knobs.refine on them, as `advisor recommend` runs it. Printed:
  finalists   candidates the enumerator hands on;
  bucket      finalists whose bucket size the refinement sets (gain kept above the tie band, 1%),
              and, in brackets, with every gain kept: how many a size improves at all and the
              largest gain of the bucket size alone on one finalist;
  copies      the same for multi-copy (k > 1; searched for MindSpore jobs with tp > 1);
  best        best predicted tokens/s of the finalists before -> after the refinement;
  search/refine  wall seconds of the enumerator (best of --repeat) and of the refinement.
Then, for one data-parallel-heavy candidate, the exposed data-parallel time by bucket size (the
trade-off of advisor.cost.fusion: small buckets pay start-ups, big ones a long tail).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.cost import fusion  # noqa: E402
from advisor.cost.estimate import estimate, estimate_batch  # noqa: E402
from advisor.commands.inputs import resolve_inputs  # noqa: E402
from advisor.search import Pins  # noqa: E402
from advisor.search.comm_knobs import refine  # noqa: E402
from advisor.search.enumerate import search  # noqa: E402
from advisor.space.strategy import Strategy  # noqa: E402

CASES = [
    ("gpt3-175b", "dgx-a100-80g", 64),
    ("gpt3-175b", "dgx-a100-80g", 512),
    ("llama3-70b", "dgx-h100", 64),
    ("llama3-8b", "dgx-h100", 512),
    ("gpt3-175b", "ascend-910b", 512),
]
FRAMEWORKS = ("megatron", "mindspore")


def case(model: str, hardware: str, devices: int, framework: str, repeat: int) -> str:
    i = resolve_inputs(model, hardware, devices=devices)
    job = replace(i.job, framework=framework)
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = search(i.model, i.hardware, i.cluster, job, Pins(), top_k=5).finalists
        walls.append(time.perf_counter() - start)
    start = time.perf_counter()
    kept = refine(i.model, i.hardware, i.cluster, job, out)
    refine_s = time.perf_counter() - start
    before = estimate_batch(i.model, i.hardware, i.cluster, job, out).tokens_per_s
    after = estimate_batch(i.model, i.hardware, i.cluster, job, kept).tokens_per_s
    # every gain kept, each knob alone: how many finalists it changes and its largest gain on one
    anything = refine(i.model, i.hardware, i.cluster, job, out, min_gain=0.0)
    alone = {}
    for knob, only, changed in (
            ("bucket", replace(out, grad_bucket_mb=anything.grad_bucket_mb), anything.grad_bucket_mb > 0),
            ("copies", replace(anything, grad_bucket_mb=out.grad_bucket_mb), anything.micro_batch_copies > 1)):
        tps = estimate_batch(i.model, i.hardware, i.cluster, job, only).tokens_per_s
        alone[knob] = (int(changed.sum()), float((tps / before - 1.0).max()))
    kept_bucket = int((kept.grad_bucket_mb > 0).sum())
    kept_copies = int((kept.micro_batch_copies > 1).sum())
    picked = sorted({float(x) for x in kept.grad_bucket_mb if x > 0})
    ks = sorted({int(x) for x in kept.micro_batch_copies if x > 1})
    return (f"{model:10s} {hardware:12s} {devices:4d} {framework:9s} {len(out):3d}  bucket {kept_bucket:3d} "
            f"({alone['bucket'][0]:3d}, {alone['bucket'][1]:+5.2%})  copies {kept_copies:3d} ({alone['copies'][0]:3d}, "
            f"{alone['copies'][1]:+5.2%})  best {before.max():10,.0f} -> {after.max():10,.0f} "
            f"({after.max() / before.max() - 1.0:+5.1%})  search {min(walls):5.2f} s  refine {refine_s:5.3f} s"
            + (f"  sizes {picked}" if picked else "") + (f"  k {ks}" if ks else ""))


def bucket_table() -> None:
    i = resolve_inputs("gpt3-13b", "dgx-a100-80g", devices=512)
    m = i.job.global_batch_size // 64
    s = Strategy(dp=64, tp=8, pp=1, micro_batch_size=1, num_micro_batches=m, zero_stage=1, sequence_parallel=True)
    default_mb = float(fusion.default_bucket_bytes(i.job, 64)) / fusion.MIB
    print(f"\n== exposed data-parallel time by bucket size: gpt3-13b on 512 A100, dp 64 x tp 8, ZeRO-1, "
          f"{m} micro-batches (Megatron default {default_mb:.0f} MiB)")
    base = estimate(i.model, i.hardware, i.cluster, i.job, s)
    print(f"   {'default':>9s}  dp_comm {base.time_s['dp_comm'] * 1e3:8.2f} ms  step {base.step_time_s:7.3f} s")
    for mb in (1.0, 5.0, 25.0, 40.0, 64.0, 100.0, 200.0, 500.0, 2000.0):
        e = estimate(i.model, i.hardware, i.cluster, i.job, replace(s, grad_bucket_mb=mb))
        print(f"   {mb:7.0f} MiB  dp_comm {e.time_s['dp_comm'] * 1e3:8.2f} ms  step {e.step_time_s:7.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("== finalists of the enumerator (top 5), then the knobs; gain kept above the 1% tie band "
          "(in brackets: any gain)")
    for model, hardware, devices in CASES:
        for framework in FRAMEWORKS:
            print("   " + case(model, hardware, devices, framework, args.repeat))
    bucket_table()


if __name__ == "__main__":
    main()
