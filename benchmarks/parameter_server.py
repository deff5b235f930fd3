"""Predicted throughput of the recommendation modes: collective (replicated or sharded tables with
all-to-all), parameter server and hybrid, for the bundled embedding-heavy models on 1-64 nodes, the
mode `recommend` chooses, and where a PS mode overtakes the collective modes as the tables grow.

Clusters: dgx-a100-80g as bundled (one 200 Gb/s HDR NIC per GPU, 25 GB/s) and the same nodes on
100 Gb Ethernet per node (1.5625 GB/s per GPU: `whatif --inter-node-gbps`). Prints figures; asserts
nothing. Also prints the published measurements the cost model is held against (advisor/validation/
recsys_runs.yaml: NVIDIA DeepLearningExamples PyTorch DLRM on DGX A100 and DGX-2, 1-16 GPUs) with
the error of each prediction.

    python benchmarks/parameter_server.py [--execute [--hardware this-machine.yaml]]

--execute also runs a PS plan (wide-deep-criteo, synchronous and asynchronous) and a hybrid plan
(dlrm-criteo-1tb) that `recommend` writes for 2 workers and 2 servers, with `advisor execute --tiny
--dtype fp32` (real server and worker processes on gloo), and prints the loss match with one
process (asynchronous: with the one-process replay of the servers' records), the largest memory
error over the roles, the asynchronous run's measured and predicted staleness and, with --hardware
(a profile of this machine from `advisor calibrate`), the measured over predicted step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.search.parameter_server import PsPins, recommend_recsys  # noqa: E402
from advisor.specs.hardware import load_hardware  # noqa: E402
from advisor.specs.job import Cluster, TrainingJob  # noqa: E402
from advisor.specs.model import load_model  # noqa: E402
from advisor.validation.recsys_runs import checks  # noqa: E402

NODES = (1, 2, 4, 8, 16, 32, 64)
ETHERNET_GBPS = 100 / 8 / 8        # 100 Gb/s per node shared by 8 GPUs, in GB/s per GPU


def best(model, hw, cluster, job, mode: str) -> tuple[float, str]:
    """Best samples/s of one mode family (none = collective), with what it chose."""
    try:
        r = recommend_recsys(model, hw, cluster, job, PsPins(mode=mode), top_k=1)
    except Exception as exc:     # infeasible: nothing of this mode fits
        return 0.0, type(exc).__name__
    e = r.estimates[0]
    c = e.config
    what = c.mode if c.mode in ("replicated", "sharded") else f"{c.servers}{c.server_placement[0]}"
    return e.samples_per_s, what


def sweep(model_name: str, hw, label: str) -> None:
    model = load_model(model_name)
    print(f"\n{model_name} on {label}: best samples/s per mode (batch = published batch x nodes, ≥ 1 per device)")
    print(f"{'nodes':>5} {'collective':>18} {'ps':>16} {'hybrid':>16}  chosen")
    for nodes in NODES:
        cluster = Cluster.of(hw, nodes=nodes)
        batch = max(model.global_batch_size * nodes // cluster.devices, 1) * cluster.devices
        job = TrainingJob(global_batch_size=batch, seq_length=1, dtype="bf16", optimizer="sgd")
        cols = [best(model, hw, cluster, job, m) for m in ("none", "ps", "hybrid")]
        chosen = recommend_recsys(model, hw, cluster, job, PsPins(), top_k=1).estimates[0].config
        pick = chosen.mode + (f" ({chosen.servers} {chosen.server_placement})" if chosen.servers else "")
        print(f"{nodes:>5} " + " ".join(f"{v / 1e6:>9.2f}M {w:>7}" for v, w in cols) + f"  {pick}")


def crossover(model_name: str, hw, label: str, nodes: int) -> None:
    """Scale every table's rows (and hold the batch): where does PS/hybrid overtake the collective modes?"""
    model = load_model(model_name)
    cluster = Cluster.of(hw, nodes=nodes)
    batch = max(model.global_batch_size * nodes // cluster.devices, 1) * cluster.devices
    job = TrainingJob(global_batch_size=batch, seq_length=1, dtype="bf16", optimizer="sgd")
    print(f"\n{model_name} on {nodes} nodes of {label}, tables scaled: collective vs PS/hybrid (samples/s)")
    first = None
    for scale in (0.01, 0.1, 1, 4, 16, 64, 256):
        tables = tuple(replace(t, rows=max(1, int(t.rows * scale))) for t in model.tables)
        scaled = replace(model, tables=tables)
        coll = max(best(scaled, hw, cluster, job, "none")[0], 0.0)
        ps = max(best(scaled, hw, cluster, job, "ps")[0], best(scaled, hw, cluster, job, "hybrid")[0])
        gib = scaled.embedding_params * 4 / 2 ** 30
        mark = "PS wins" if ps > coll else ""
        if ps > coll and first is None:
            first = scale
        print(f"  rows x{scale:<6g} tables {gib:9.1f} GiB  collective {coll / 1e6:8.2f}M  ps/hybrid {ps / 1e6:8.2f}M  {mark}")
    print(f"  PS overtakes the collective modes from rows x{first} on" if first else "  PS never overtakes here")


def published_check() -> None:
    """Every published DLRM run of advisor/validation/recsys_runs.yaml (held out) against its prediction."""
    print("Published DLRM throughput (NVIDIA DeepLearningExamples PyTorch DLRM README) vs prediction, sharded:")
    rows = checks()
    for c in rows:
        print(f"  {c.label:32} measured {c.measured_samples_per_s / 1e6:6.2f}M  predicted "
              f"{c.predicted_samples_per_s / 1e6:6.2f}M  ratio {c.ratio:4.2f}  error {100 * (c.ratio - 1):+5.0f}%  "
              f"({c.bottleneck})")
    worst = max(rows, key=lambda c: abs(c.ratio - 1))
    print(f"  worst: {worst.label} ({worst.ratio:.2f}x); within 35%: {sum(abs(c.ratio - 1) <= 0.35 for c in rows)}"
          f" of {len(rows)}")


def executed(hardware: str | None) -> None:
    print("\nexecutor: recommend (2 workers, 2 servers) -> execute --tiny --dtype fp32 on this machine")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with tempfile.TemporaryDirectory(prefix="advisor-ps-bench-") as tmp:
        for model, mode, asynchronous in (("wide-deep-criteo", "ps", False), ("wide-deep-criteo", "ps", True),
                                          ("dlrm-criteo-1tb", "hybrid", False)):
            plan = Path(tmp) / f"{model}-{mode}-{asynchronous}.json"
            subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", model, "--hardware",
                            "dgx-a100-80g", "--devices", "2", "--ps-mode", mode, "--ps-servers", "2", "--out", str(plan),
                            "--json"] + (["--ps-async"] if asynchronous else []),
                           check=True, capture_output=True, env=env, cwd=root)
            cmd = [sys.executable, "-m", "advisor", "execute", str(plan), "--tiny", "--dtype", "fp32", "--steps", "6",
                   "--json"] + (["--hardware", hardware] if hardware else [])
            rep = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=root).stdout)
            ratio = rep.get("time_ratio")
            stale = rep.get("staleness")
            extra = (f"  staleness {stale['mean']:.2f} (predicted {stale['predicted']:g})"
                     if stale and stale.get("mean") is not None and stale.get("predicted") is not None else "")
            print(f"  {model:18} {mode + (' async' if asynchronous else ''):12}  loss max rel diff "
                  f"{rep['loss_max_rel_diff']:.1e}  memory max rel error {100 * rep['memory_max_rel_error']:.1f}%  "
                  f"step time measured/predicted {'-' if ratio is None else f'{ratio:.2f}'}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--execute", action="store_true", help="also run a PS and a hybrid plan on this machine")
    ap.add_argument("--hardware", help="profile of this machine (advisor calibrate) for the time comparison")
    args = ap.parse_args()
    start = time.perf_counter()
    a100 = load_hardware("dgx-a100-80g")
    ether = a100.with_overrides(inter_node_gbps=ETHERNET_GBPS)
    published_check()
    for name in ("wide-deep-criteo", "dlrm-criteo-1tb"):
        sweep(name, a100, "dgx-a100-80g (HDR, 25 GB/s per GPU)")
        sweep(name, ether, f"dgx-a100-80g on 100GbE ({ETHERNET_GBPS:.3g} GB/s per GPU)")
    crossover("wide-deep-criteo", a100, "dgx-a100-80g", nodes=8)
    crossover("wide-deep-criteo", ether, "dgx-a100-80g on 100GbE", nodes=8)
    if args.execute:
        executed(args.hardware)
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
