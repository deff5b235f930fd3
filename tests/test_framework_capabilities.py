"""What each framework runs, from its record (advisor.specs.frameworks): the search offers only that, estimate
refuses the rest naming the framework and what it lacks, and the export of a plan priced for its framework
writes it with nothing reported as inexpressible."""

from __future__ import annotations

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.cost.band import memory_headroom
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.search import Pins
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.frameworks import FRAMEWORKS


def run_cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, timeout=600)

TARGET = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "torchtitan", "mindspore": "mindspore"}
SETTINGS = [("llama3-70b", "dgx-h100", 64), ("llama3-8b", "dgx-h100", 16), ("mixtral-8x7b", "dgx-h100", 32)]


def _plans(model, hardware, devices, framework, top=3):
    """The plans `advisor recommend` offers: leaving the memory band's headroom free."""
    i = resolve_inputs(model, hardware, devices=devices, framework=framework, memory_margin=memory_headroom())
    return recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=top).plans


@pytest.mark.parametrize("framework", sorted(TARGET))
@pytest.mark.parametrize("model,hardware,devices", SETTINGS)
def test_recommended_plans_export_as_priced(framework, model, hardware, devices):
    for plan in _plans(model, hardware, devices, framework):
        result = export_plan(plan, TARGET[framework])
        assert result.unsupported == (), (plan.strategy, result.unsupported)


def test_headline_plan_runs_on_megatron():
    """The README's headline setting used to pick ZeRO-2 under pipelining, which Megatron-Core does not run."""
    for plan in _plans("llama3-70b", "dgx-h100", 64, "megatron", top=5):
        s = plan.strategy
        assert s.zero_stage in ((0, 1) if s.pp > 1 else (0, 1, 2, 3))
        assert s.pipeline_schedule != "gpipe"


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_search_never_offers_what_the_record_lacks(name):
    fw = FRAMEWORKS[name]
    for plan in _plans("llama3-8b", "dgx-h100", 16, name, top=8):
        s = plan.strategy
        assert s.zero_stage in (fw.zero_stages_under_pipeline if s.pp > 1 else fw.zero_stages)
        assert s.pp == 1 or s.pipeline_schedule in fw.schedules
        assert s.tp == 1 or s.sequence_parallel in fw.sequence_parallel
        assert s.cp == 1 or s.cp_comm in fw.cp_kinds
        assert not (s.offload_optimizer and not s.offload_params and not fw.optimizer_offload)
        i = resolve_inputs("llama3-8b", "dgx-h100", devices=16, framework=name)
        assert violations(i.model, i.cluster, i.job, s) == []


def _estimate(*args):
    return run_cli("estimate", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "8", *args)


def test_estimate_names_the_framework_and_what_it_lacks():
    r = _estimate("--tp", "8", "--pp", "4", "--zero", "2")
    assert r.returncode == 2
    assert "megatron runs ZeRO 0, 1 with pp > 1; zero = 2, pp = 4" in r.stderr
    r = _estimate("--tp", "8", "--pp", "4", "--zero", "1", "--framework", "deepspeed", "--schedule", "interleaved-1f1b",
                  "--vpp", "2")
    assert r.returncode == 2 and "deepspeed runs 1f1b; schedule = interleaved-1f1b" in r.stderr
    r = _estimate("--tp", "8", "--framework", "torchtitan", "--zero", "1")
    assert r.returncode == 2 and "torchtitan runs ZeRO 0, 2, 3 without pipelining" in r.stderr
    r = _estimate("--tp", "8", "--framework", "torchtitan", "--no-sequence-parallel")
    assert r.returncode == 2 and "torchtitan runs sequence_parallel = true with tp > 1" in r.stderr
    r = _estimate("--tp", "8", "--cp", "2", "--framework", "deepspeed")
    assert r.returncode == 2 and "deepspeed runs cp_comm a2a and no cp with pp > 1" in r.stderr
    r = _estimate("--tp", "8", "--framework", "deepspeed", "--dtype", "fp8")
    assert r.returncode == 2 and "framework deepspeed trains in fp32, tf32, fp16, bf16 only" in r.stderr


def test_a_plan_is_repriced_for_another_framework(tmp_path):
    """estimate --plan P --framework F --out P2: the plan priced for F, which F's export then writes as priced."""
    plan = tmp_path / "p.json"
    r = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "2", "--framework",
                "megatron", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--top", "1", "--out", str(plan))
    assert r.returncode == 0, r.stderr
    r = run_cli("export", str(plan), "--to", "torchtitan")
    assert r.returncode == 2 and "priced for Megatron-LM" in r.stderr
    again = tmp_path / "q.json"
    r = run_cli("estimate", "--plan", str(plan), "--framework", "torchtitan", "--out", str(again))
    assert r.returncode == 0, r.stderr
    r = run_cli("export", str(again), "--to", "torchtitan")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_deepspeed_record_prices_its_defaults():
    """DeepSpeed reduces bf16 gradients in bf16 unless communication_data_type says otherwise."""
    ds = resolve_inputs("llama3-8b", "dgx-h100", devices=16, framework="deepspeed").job
    pt = resolve_inputs("llama3-8b", "dgx-h100", devices=16, framework="pytorch").job
    assert (ds.grad_reduce_bytes, pt.grad_reduce_bytes) == (2.0, 4.0)
    with pytest.raises(AdvisorError, match="deepspeed trains in"):
        resolve_inputs("llama3-8b", "dgx-h100", devices=16, framework="deepspeed", dtype="fp8")
    assert Strategy is not None


def test_every_priced_calibration_run_is_legal_under_its_framework():
    """One set of legality rules: the runs advisor.validation prices (uneven pipeline chunks included, as the
    Llama 3.1 405B recipes give them) break no rule of advisor.space.rules under their own framework."""
    from advisor.space.rules import broken_rules
    from advisor.specs.job import Cluster
    from advisor.validation.accuracy import run_hardware, usable_runs

    broken = {}
    for run in usable_runs():
        hw = run_hardware(run)
        cluster = Cluster(nodes=max(1, run.devices // hw.node.devices_per_node), devices=run.devices)
        rules = broken_rules(run.model, cluster, run.job, run.strategy)
        if rules:
            broken[run.id] = rules
    # the MoE parallel-folding recipes (ep over the tensor-parallel ranks too) included: Strategy.fold_experts
    assert broken == {}
