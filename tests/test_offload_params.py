"""Parameter offload (issue 13, host/device heterogeneous training of transformers): ZeRO-Infinity's
offload_param, FSDP2's CPUOffloadPolicy, MindSpore's offload_param. The weight and gradient shards
live in host memory and cross PCIe every micro-batch; priced, searched, carried by plans, exported."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.cost.estimate import estimate, estimate_batch
from advisor.cost.memory import ALLOCATOR_OVERHEAD, GIB, state_bytes_per_param
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import load_plan, plan_from_dict, plan_to_dict
from advisor.search import Pins
from advisor.search.enumerate import search
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

H100 = load_hardware("dgx-h100")
MODEL = load_model("llama3-70b")
JOB = TrainingJob(global_batch_size=64, seq_length=8192, framework="pytorch")     # FSDP2's CPU offload
CLUSTER = Cluster.of(H100, nodes=1)
BASE = Strategy(dp=2, tp=1, pp=1, cp=4, micro_batch_size=1, num_micro_batches=32, zero_stage=3,
                offload_optimizer=True, mesh_order=("pp", "tp", "dp", "cp"))
runner = CliRunner()


def test_shards_move_to_the_host_and_cross_pcie_each_micro_batch():
    off, on = (estimate(MODEL, H100, CLUSTER, JOB, replace(BASE, offload_params=p)) for p in (False, True))
    assert on.memory_gib.parameters == 0.0 and on.memory_gib.gradients == 0.0
    wb, gb, _ = state_bytes_per_param(JOB)
    shard = (off.memory_gib.parameters / wb) * GIB          # parameters per device (the ZeRO-3 shard)
    assert off.memory_gib.gradients == pytest.approx(shard * gb / GIB)
    # the step pays only what the transfers cannot hide: here they hide under the compute, and the
    # updated weights no longer go back after the host's step (DeepSpeed's optimizer offload already
    # sends each micro-batch's gradients under its backward) ...
    assert on.time_s["offload"] == pytest.approx(off.time_s["offload"] - shard * wb / (H100.host.pcie_bandwidth_gbps * 1e9))
    # ... but not on a short step (sequence 512): per micro-batch, transfers minus compute
    short = replace(JOB, seq_length=512)
    e = estimate(MODEL, H100, CLUSTER, short, replace(BASE, offload_params=True, cp=1, dp=8, num_micro_batches=8))
    e_off = estimate(MODEL, H100, CLUSTER, short, replace(BASE, cp=1, dp=8, num_micro_batches=8))
    assert e.time_s["offload"] > e_off.time_s["offload"]
    assert e.step_time_s > e_off.step_time_s


def test_rule_and_pins_need_zero3_the_optimizer_offloaded_and_a_framework_with_it():
    assert violations(MODEL, CLUSTER, JOB, replace(BASE, offload_params=True)) == []
    megatron = replace(JOB, framework="megatron")
    assert any("not megatron" in v for v in violations(MODEL, CLUSTER, megatron, replace(BASE, offload_params=True)))
    assert not search(MODEL, H100, CLUSTER, megatron, Pins(), top_k=3).finalists.offload_params.any()
    with pytest.raises(AdvisorError, match="Megatron-LM has no parameter offload"):
        search(MODEL, H100, CLUSTER, megatron, Pins(offload_params=True), top_k=3)
    for bad in (replace(BASE, offload_params=True, zero_stage=2), replace(BASE, offload_params=True, offload_optimizer=False)):
        assert any("parameter offload needs ZeRO stage 3" in v for v in violations(MODEL, CLUSTER, JOB, bad))
    with pytest.raises(AdvisorError, match="--offload-params needs ZeRO stage 3"):
        Pins(offload_params=True, zero_stage=2)


def test_search_uses_it_where_it_frees_memory_and_never_when_pinned_off():
    job = replace(JOB, framework="deepspeed")      # ZeRO-Infinity: the optimizer alone can go to the host too
    free = search(MODEL, H100, CLUSTER, job, Pins(), top_k=3).finalists
    none = search(MODEL, H100, CLUSTER, job, Pins(offload_params=False), top_k=3).finalists
    pinned = search(MODEL, H100, CLUSTER, job, Pins(offload_params=True), top_k=3).finalists
    assert not none.offload_params.any() and pinned.offload_params.all()
    # 70B on one node: freeing the shards makes room for a faster layout, which the search takes
    best = [float(estimate_batch(MODEL, H100, CLUSTER, job, f).tokens_per_s.max()) for f in (free, none)]
    assert bool(free.offload_params[0]) and best[0] > best[1]


def test_plan_and_exports(tmp_path):
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["recommend", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "1",
                            "--global-batch", "64", "--seq-len", "8192", "--offload-params", "--framework", "pytorch",
                            "--pp", "1", "--out", str(out)])     # pp 1: the plan is exported to DeepSpeed's ZeRO-3 too
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["parallel"]["offload_params"] is True
    plan = load_plan(out)
    assert plan.strategy.offload_params
    ds = json.loads(export_plan(plan, "deepspeed").files["ds_config.json"])
    assert ds["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert ds["zero_optimization"]["stage"] == 3
    tt = export_plan(plan, "torchtitan")
    toml = next(v for k, v in tt.files.items() if k.endswith(".toml"))
    assert "enable_cpu_offload = true" in toml and not any("offload" in u for u in tt.unsupported)
    assert "parameter offload" in str(pytest.raises(AdvisorError, plan_from_dict,
                                                     {**plan_to_dict(plan), "training": {**plan_to_dict(plan)["training"],
                                                                                          "framework": "megatron"}},
                                                     "edited").value)
    ms = export_plan(plan, "mindspore").files["parallel_context.py"]
    assert 'ms.set_offload_context(offload_config={"offload_param": "cpu"' in ms
    est = runner.invoke(app, ["estimate", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "1",
                              "--global-batch", "64", "--seq-len", "8192", "--dp", "2", "--tp", "1", "--cp", "4",
                              "--zero", "3", "--offload-optimizer", "--offload-params", "--framework", "pytorch",
                              "--json"])
    assert json.loads(est.output)["memory_gib"]["parameters"] == 0.0


def test_one_replica_keeps_the_fetched_layers_on_the_device():
    """dp = 1 gathers nothing, but the offloaded layer being fetched, the prefetched one and the
    gradients leaving still take device memory (a single GPU with ZeRO-Infinity)."""
    model = load_model("llama3-8b")
    job = TrainingJob(global_batch_size=8, seq_length=4096, framework="pytorch")
    one = Cluster.of(H100, devices=1)
    s = Strategy(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=8, zero_stage=3, offload_optimizer=True)
    off, on = (estimate(model, H100, one, job, replace(s, offload_params=p)) for p in (False, True))
    wb, _, _ = state_bytes_per_param(job)
    assert on.memory_gib.parameters == 0.0 and on.memory_gib.gradients == 0.0

    def own_buffers(e):        # the buffers less the allocator's share of everything else
        m = e.memory_gib
        return m.buffers - ALLOCATOR_OVERHEAD * (m.parameters + m.gradients + m.optimizer + m.activations)

    fetched = (2.0 * wb + job.grad_reduce_bytes) * model.dense_layer_params / GIB
    assert own_buffers(on) - own_buffers(off) == pytest.approx(fetched)


def test_offload_fraction_splits_the_optimizer_between_host_and_device(tmp_path):
    """Megatron's --optimizer-offload-fraction / DeepSpeed's ratio: a share f of the states on the
    host, the rest stepped on the device meanwhile; searched per finalist (advisor.search.comm_knobs)."""
    model = load_model("llama3-8b")
    hw = load_hardware("dgx-a100-80g")
    job = TrainingJob(global_batch_size=32, seq_length=4096)
    cluster = Cluster.of(hw, nodes=1)
    s = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1, offload_optimizer=True)
    full, part = (estimate(model, hw, cluster, job, replace(s, offload_fraction=f)) for f in (1.0, 0.25))
    device_only = estimate(model, hw, cluster, job, replace(s, offload_optimizer=False))
    states = device_only.memory_gib.optimizer
    assert full.memory_gib.optimizer == 0.0 and full.host_optimizer_gib == pytest.approx(states)
    assert part.memory_gib.optimizer == pytest.approx(0.75 * states)
    assert part.host_optimizer_gib == pytest.approx(0.25 * states)
    gpu = device_only.time_s["optimizer"]
    assert part.time_s["optimizer"] == pytest.approx(0.75 * gpu, rel=1e-6)
    # the host's quarter runs while the device steps its three quarters: only the excess shows
    assert part.time_s["offload"] == pytest.approx(max(0.25 * full.time_s["offload"] - 0.75 * gpu, 0.0), rel=1e-6)
    assert part.step_time_s < full.step_time_s
    # the search keeps the smallest share that fits and pays (+18% here), the plan and Megatron carry it
    out = tmp_path / "off.json"
    r = runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "1",
                            "--global-batch", "32", "--seq-len", "4096", "--offload", "--memory-margin", "0",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert plan.strategy.offload_fraction == 0.25
    assert "--optimizer-offload-fraction 0.25\n" in export_plan(plan, "megatron").files["megatron_pretrain_gpt.sh"]
    assert any(u.startswith("parallel.offload_fraction = 0.25") for u in export_plan(plan, "deepspeed").unsupported)
    bad = {**plan_to_dict(plan), "parallel": {**plan_to_dict(plan)["parallel"], "offload_fraction": 0}}
    with pytest.raises(AdvisorError, match="key 'offload_fraction' must be a positive number"):
        plan_from_dict(bad, "edited")
    flag = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "1",
                               "--offload-optimizer", "--zero", "1", "--offload-fraction", "2"])
    assert isinstance(flag.exception, AdvisorError) and "--offload-fraction must be" in str(flag.exception)


def test_vectorized_and_scalar_estimates_agree_with_offload():
    from advisor.cost.estimate import estimate_batch
    from advisor.space.strategy import StrategyBatch

    strategies = [replace(BASE, offload_params=True), replace(BASE, offload_fraction=0.5),
                  replace(BASE, dp=8, cp=1, offload_params=True, num_micro_batches=8), BASE]
    batch = StrategyBatch.from_strategies(strategies, MODEL.num_layers)
    e = estimate_batch(MODEL, H100, CLUSTER, JOB, batch)
    for i, s in enumerate(strategies):
        one = estimate(MODEL, H100, CLUSTER, JOB, s)
        assert batch.strategy(i) == replace(s, stage_layers=batch.strategy(i).stage_layers)
        assert one.step_time_s == pytest.approx(float(e.step_time_s[i]), rel=1e-12)
        assert one.memory_gib.total * GIB == pytest.approx(float(e.memory.total[i]), rel=1e-12)
        assert one.host_optimizer_gib * GIB == pytest.approx(float(e.memory.host_optimizer[i]), rel=1e-12)


def test_skeletons_said_not_to_fit_have_no_variant_that_fits_with_parameter_offload():
    """One replica (dp x cp = 1): the fetched layers of parameter offload can outweigh a one-layer
    stage's own weights, so 'may fit' tries every lone ZeRO/offload pair (framework pytorch)."""
    from collections import Counter

    import numpy as np

    from advisor.cost.estimate import estimate_batch
    from advisor.search import enumerate as en
    from advisor.specs.hardware import hardware_from_dict
    from advisor.specs.model import model_from_dict

    m = model_from_dict({"name": "deep", "source": "test", "num_layers": 8, "hidden_size": 8192,
                         "num_attention_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 28672, "vocab_size": 1000,
                         "seq_length": 512}, "test")
    raw = load_hardware("dgx-a100-80g").raw
    hw = hardware_from_dict({**raw, "device": {**raw["device"], "memory_gib": 4.0}}, "small")
    cluster = Cluster.of(hw, devices=8)
    job = TrainingJob(global_batch_size=8, seq_length=512, framework="pytorch")
    rows = en.skeleton_rows(m, hw, cluster, job, Pins(), Counter(), Counter())
    options = en.zero_offload_options(Pins(), job.framework)
    _, may_fit = en.bound_skeletons(m, hw, cluster, job, rows, options)
    full = en.mesh_variants(en.zero_variants({**rows, "row": np.arange(len(rows["dp"]))}, options), hw, Pins(), m)
    wrongly_pruned = fitting = 0
    for idx in en.chunks_by_pp(full):
        part = en._take(full, idx)
        fits = estimate_batch(m, hw, cluster, job, en.to_batch(m, job, part)).fits
        fitting += int(fits.sum())
        wrongly_pruned += int((fits & ~may_fit[part["row"]]).sum())
    assert fitting > 0 and wrongly_pruned == 0


def test_new_flags_are_refused_or_applied_where_they_are_not_priced(tmp_path):
    def refused(args, words):
        r = runner.invoke(app, args)
        assert isinstance(r.exception, AdvisorError) and words in str(r.exception), r.output

    refused(["estimate", "--model", "wide-deep-criteo", "--hardware", "dgx-a100-80g", "--nodes", "1",
             "--offload-params"], "transformer settings")
    refused(["estimate", "--model", "hat-supernet", "--hardware", "dgx-a100-80g", "--devices", "4", "--pp", "2",
             "--offload-fraction", "0.5"], "--offload-fraction is not available for a supernet")
    refused(["estimate", "--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1", "--tp", "8", "--pp", "2",
             "--offload-fraction", "0.5"], "--offload-fraction is not available on a mixed cluster")
    # a fraction is Megatron's and (ZeRO-3) DeepSpeed's only
    fraction = replace(BASE, zero_stage=1, offload_fraction=0.5)
    for framework in ("torchtitan", "mindspore"):
        assert any("offload fraction" in v for v in violations(MODEL, CLUSTER, replace(JOB, framework=framework),
                                                                 fraction))
    deepspeed = replace(JOB, framework="deepspeed")                 # offload_optimizer.ratio: ZeRO-3 only
    fraction = replace(fraction, cp_comm="a2a", mesh_order=("pp", "dp", "cp", "tp"))
    assert any("offload fraction" in v for v in violations(MODEL, CLUSTER, deepspeed, fraction))
    assert violations(MODEL, CLUSTER, deepspeed, replace(fraction, zero_stage=3)) == []
    # --plan: the flag prices the plan's strategy with it
    out = tmp_path / "p.json"
    assert runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "1",
                               "--global-batch", "32", "--seq-len", "4096", "--offload", "--out", str(out)]).exit_code == 0
    base = json.loads(runner.invoke(app, ["estimate", "--plan", str(out), "--json"]).output)
    half = json.loads(runner.invoke(app, ["estimate", "--plan", str(out), "--offload-fraction", "0.5", "--json"]).output)
    assert half["host_optimizer_gib"] == pytest.approx(base["host_optimizer_gib"] * 0.5 / 0.25)


def test_a_pinned_offload_is_kept_by_every_refinement():
    """--offload pins optimizer offload: the vPipe repartitioning, which tries an offloaded pipeline's states back on
    the device, must not hand back plans without it (it did once ties reached the pair band)."""
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.search import Pins

    i = resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=1, global_batch_size=32, seq_length=4096)
    pins = Pins.from_values({"offload_optimizer": True, "pp": 2})     # pipelined: what vPipe refines
    plans = recommend(i.model, i.hardware, i.cluster, i.job, pins=pins, top_k=5).plans
    assert len(plans) == 5 and all(p.strategy.offload_optimizer and p.strategy.pp == 2 for p in plans)
