"""MindPipe's objectives (issue 15), as far as they are built: converging efficiency and carbon.

For two bundled models, `recommend --objective time-to-target` against the throughput objective: the
global batch each would pick, its best plan's tokens/s, and the wall-clock time and tokens each batch
needs to reach the target (McCandlish et al. 2018; Kaplan et al. 2020, advisor.cost.convergence).
Figures, not a pass/fail test.

    python benchmarks/mindpipe.py

Carbon: one plan's facility energy and tCO2e to train its token budget at three grid intensities
(advisor.cost.carbon), and what --objective carbon changes against --objective throughput.

Contention: `advisor calibrate`'s probe on this machine (an all-reduce and a send between two gloo
ranks, alone and together) against the cost model's shared-link prediction, from the profile's own
fitted links; `--hardware PROFILE.yaml` reads a calibrated profile's figures instead of calibrating
(about 30 s). Then what contention costs an MoE plan whose FSDP traffic shares links with its tp and ep traffic,
with fair sharing and with priority to the pipeline (advisor.cost.contention).

vPipe: a 1F1B plan that does not fit without recomputation, with every layer recomputed against the
memory-aware repartitioning (advisor.search.vpipe) for MindSpore (a count per stage) and Megatron (one count),
and against swapping activations to the host (MindSpore only).

Mixed cluster: the best plan on 16 DGX A100 + 16 DGX H100 nodes (advisor.search.mixed) against the best
plans of each homogeneous half at the same global batch, and the same for a pipeline pinned to cut
between the types.

Supernets: hat-supernet (HAT's search space, advisor.specs.supernet) on 4 A100s priced with NASPipe's
causal schedule against sequential training and the no-sharing bound, for each pipeline depth; then
the tiny supernet trained on 4 CPU pipeline ranks in NASPipe's order against sequential training of the
same 16 subnets (the losses' largest difference), and with the causal order dropped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.commands.objective import time_to_target  # noqa: E402
from advisor.cost.carbon import DEFAULT_PUE, GRID_GCO2E_PER_KWH  # noqa: E402
from advisor.cost.convergence import Target  # noqa: E402
from advisor.render.formatting import count, duration  # noqa: E402
from advisor.specs.hardware import load_hardware  # noqa: E402
from advisor.specs.job import Cluster, TrainingJob  # noqa: E402
from advisor.specs.model import load_model  # noqa: E402

CASES = (   # model, hardware, devices, sequence, starting global batch, target loss (Kaplan's units)
    ("gpt3-1.3b", "dgx-a100-80g", 8, 2048, 512, 2.6),
    ("llama3-8b", "dgx-h100", 64, 8192, 512, 2.3),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hardware", help="a profile written by advisor calibrate (default: calibrate now)")
    args = ap.parse_args()
    started = time.perf_counter()
    print("converging efficiency: throughput-optimal vs time-to-target-optimal global batch")
    for name, hw_name, devices, seq, gbs, loss in CASES:
        model, hw = load_model(name), load_hardware(hw_name)
        cluster = Cluster.of(hw, devices=devices)
        job = TrainingJob(global_batch_size=gbs, seq_length=seq)
        result, trials = time_to_target(model, hw, cluster, job, Target(loss=loss), top_k=1)
        timed = [t for t in trials if t.time_to_target_s is not None]
        given = next(t for t in timed if t.global_batch_size == gbs)    # what --objective throughput keeps
        first = min(timed, key=lambda t: t.time_to_target_s)
        print(f"\n{name} on {devices} x {hw_name}, sequence {seq}, target loss {loss} "
              f"(critical batch {count(first.convergence.critical_batch_tokens)} tokens, "
              f"minimum {count(first.convergence.minimum_tokens)} tokens)")
        print(f"  {'global batch':>12} {'tokens/s':>10} {'tokens to target':>17} {'time to target':>15}")
        for t in timed:
            mark = ("  <- given batch (--objective throughput)" if t is given else "") + (
                "  <- --objective time-to-target" if t is first else "")
            print(f"  {t.global_batch_size:>12} {count(t.tokens_per_s):>10} {count(t.convergence.tokens_to_target):>17} "
                  f"{duration(t.time_to_target_s):>15}{mark}")
        saved = 1.0 - first.time_to_target_s / given.time_to_target_s
        print(f"  the time-to-target choice reaches the target {saved:.0%} sooner than the given batch, at "
              f"{first.tokens_per_s / given.tokens_per_s:.0%} of its throughput")
    carbon_section()
    contention_section(args.hardware)
    vpipe_section()
    mixed_section()
    supernet_section()
    print(f"\n{time.perf_counter() - started:.1f} s")


def carbon_section() -> None:
    from advisor.commands.recommend import recommend

    model, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=8)
    print(f"\ncarbon: llama3-70b on {cluster.devices} x dgx-h100, 2T tokens, PUE {DEFAULT_PUE}")
    for region in ("norway", "world", "india"):
        job = TrainingJob(global_batch_size=512, seq_length=8192, train_tokens=2e12,
                          grid_gco2e_per_kwh=GRID_GCO2E_PER_KWH[region])
        for objective in ("throughput", "carbon"):
            e = recommend(model, hw, cluster, job, top_k=1, objective=objective).estimates[0]
            print(f"  {region:>6} ({GRID_GCO2E_PER_KWH[region]:>3.0f} gCO2e/kWh)  --objective {objective:<10} "
                  f"{duration(e.time_to_train_s):>10}  HFU {e.hfu:.1%}  {e.energy_to_train_kwh / 1000:,.0f} MWh  "
                  f"{e.emissions_to_train_tco2e:.3g} tCO2e")


def vpipe_section() -> None:
    from advisor.cost.estimate import estimate
    from advisor.search.vpipe import memory_aware_strategy, swap_strategy
    from advisor.space.strategy import Strategy

    model, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=4)
    plain = Strategy(dp=2, tp=4, pp=4, micro_batch_size=1, num_micro_batches=32, zero_stage=1, sequence_parallel=True)
    print(f"\nmemory-aware repartitioning (vPipe): llama3-70b on {cluster.devices} x dgx-h100, dp2 tp4 pp4 1F1B, "
          "sequence 8192, batch 64")
    for framework in ("mindspore", "megatron"):
        job = TrainingJob(global_batch_size=64, seq_length=8192, framework=framework)
        rows = [("no recomputation", plain), ("every layer recomputed", replace(plain, recompute="full")),
                ("vPipe", memory_aware_strategy(model, hw, job, plain))]
        swapped = swap_strategy(model, hw, job, plain)
        if swapped is not None:                # MindFormers swaps per layer; Megatron-Core not under pp
            rows.append(("vPipe swap", swapped))
        for label, s in rows:
            e = estimate(model, hw, cluster, job, s)
            recomputed = "all" if s.recompute == "full" and s.recompute_layers is None else (s.recompute_layers or 0)
            if s.swap_layers is not None:
                recomputed = f"0, swapped {list(s.swap_layers)}"
            print(f"  {framework:<9} {label:<22} stages {str(list(s.resolved_stage_layers(model.num_layers))):<18} "
                  f"recomputed {str(recomputed):<14} "
                  f"{e.memory_gib.total:5.1f} GiB  {'fits' if e.feasible else 'does not fit'}  step {e.step_time_s:.2f} s")


def mixed_section() -> None:
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.mixed import mixed_inputs, recommend_mixed
    from advisor.commands.recommend import recommend
    from advisor.render.mixed import placement_text
    from advisor.search import Pins

    spec = "dgx-a100-80g:16,dgx-h100:16"
    print(f"\nmixed cluster {spec}: llama3-70b, batch 512 x 8192, bf16")
    for label, pins in (("best plan", Pins()), ("pipeline pinned dp1 tp8 pp16", Pins(dp=1, tp=8, pp=16))):
        mixed, inputs = mixed_inputs("llama3-70b", spec, None, None, global_batch_size=512)
        result = recommend_mixed(inputs, mixed, pins, top_k=1)
        s, e = result.best.strategy, result.estimates[0]
        halves = []
        for part in mixed.parts:
            half = resolve_inputs("llama3-70b", part.profile, nodes=part.nodes, global_batch_size=512)
            best = recommend(half.model, part.profile, half.cluster, half.job, top_k=1).estimates[0]
            halves.append((part.profile.name, best.tokens_per_s))
        side_by_side = sum(t for _, t in halves)
        print(f"  {label}: dp{s.dp} tp{s.tp} pp{s.pp} cp{s.cp} {count(e.tokens_per_s)} tokens/s, MFU {e.mfu:.1%} "
              f"({result.stats.seconds:.1f} s search)")
        print(f"    {placement_text(e.layout, s.stage_layers or ())}")
        print("    each half alone: " + ", ".join(f"{n} {count(t)} tokens/s" for n, t in halves)
              + f"; the mixed plan reaches {e.tokens_per_s / side_by_side:.0%} of both halves side by side, "
              f"{e.tokens_per_s / max(t for _, t in halves):.2f}x the faster half")


def supernet_section() -> None:
    import subprocess

    from advisor.cost.supernet import SupernetRun
    from advisor.search.supernet import search_supernet
    from advisor.executor.supernet.run import run_supernet
    from advisor.plan import load_plan

    net, hw = load_model("hat-supernet"), load_hardware("dgx-a100-80g")
    job = TrainingJob(global_batch_size=32, seq_length=512)
    print(f"\nsupernet: hat-supernet ({net.supernet_params / 1e6:.0f}M parameters, {len(net.candidates)} candidates "
          f"per layer) on 4 x dgx-a100-80g, 64 subnets of 32 x 512 tokens")
    for p in search_supernet(net, hw, Cluster(1, 4), job, SupernetRun(subnets=64)):
        e, s = p.estimate, p.strategy
        print(f"  dp{s.dp} pp{s.pp} layers {list(s.stage_layers or [net.num_layers])}: NASPipe {e.naspipe.makespan_s:.2f} s, "
              f"sequential {e.sequential_s:.2f} s ({e.speedup:.2f}x), no-sharing bound {e.no_dependency.makespan_s:.2f} s, "
              f"{e.naspipe.overtakes} forwards ran ahead of a held-back subnet")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", "hat-supernet", "--hardware",
                        "dgx-a100-80g", "--devices", "4", "--pp", "4", "--out", str(path), "--json"],
                       check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1])
        plan = load_plan(path)
        for causal in (True, False):
            r = run_supernet(plan, subnets=16, tiny=True, causal=causal)
            label = "NASPipe order" if causal else "causal order dropped"
            print(f"  executor, tiny, 4 CPU ranks, {label}: largest loss difference from sequential training "
                  f"{r['max_loss_difference']:.1e} ({'match' if r['losses_match'] else 'differ'} at "
                  f"{r['tolerance']:g}), {r['overtakes']} forwards ran ahead of a held-back subnet")


def contention_section(profile: str | None) -> None:
    import yaml

    from advisor.cost.estimate import estimate
    from advisor.space.strategy import Strategy

    with tempfile.TemporaryDirectory() as tmp:
        if profile is None:
            profile = str(Path(tmp) / "this-machine.yaml")
            subprocess.run([sys.executable, "-m", "advisor", "calibrate", "--nproc", "2", "--out", profile],
                           check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1])
        notes = yaml.safe_load(Path(profile).read_text())["node"]["intra_node"].get("notes", {}).get("contention")
    print("\ncontention on this machine: all-reduce and send between two gloo ranks (ms, medians)")
    if not notes:
        print(f"  {profile} has no contention probe (calibrate it again)")
    else:
        print(f"  {'size':>6} {'all-reduce':>10} {'send':>6} {'together':>8} {'predicted shared':>16} "
              f"{'predicted own links':>19} {'contention measured / predicted':>32}")
        for row in notes["points"]:
            got, model = row["measured_ms"], row["predicted_ms"]
            measured = got["together"] - max(got["all_reduce"], got["p2p"])
            predicted = model["together_shared"] - model["together_independent"]
            print(f"  {row['bytes'] >> 20:>3} MiB {got['all_reduce']:>10.2f} {got['p2p']:>6.2f} {got['together']:>8.2f} "
                  f"{model['together_shared']:>16.2f} {model['together_independent']:>19.2f} "
                  f"{measured:>15.2f} / {predicted:.2f}")
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    cluster = Cluster.of(hw, nodes=4)
    job = TrainingJob(global_batch_size=64, seq_length=4096)
    base = Strategy(dp=16, tp=2, pp=1, ep=8, micro_batch_size=1, num_micro_batches=4, zero_stage=3, recompute="full")
    print(f"\ncontention in a plan: mixtral-8x7b on {cluster.devices} x dgx-h100, dp16 tp2 ep8, FSDP (ZeRO-3), "
          "full recomputation: the gathers and reduce-scatters share NVLink and the NICs with the tp and ep traffic")
    for order in (("pp", "dp", "cp", "tp"), ("pp", "tp", "cp", "dp")):
        for priority in (False, True):
            e = estimate(model, hw, cluster, replace(job, comm_priority=priority), replace(base, mesh_order=order))
            print(f"  mesh {'-'.join(order):<12} {'priority' if priority else 'fair share':<10} contention "
                  f"{e.time_s['contention'] * 1e3:6.0f} ms of a {e.step_time_s:.2f} s step "
                  f"(ep {e.time_s['ep_comm'] * 1e3:.0f} ms, dp {e.time_s['dp_comm'] * 1e3:.0f} ms exposed)")


if __name__ == "__main__":
    main()
