"""The host's CPU Adam under optimizer offload (issue 30, "CPU optimizer offload as CPU Adam compute"): the
offloaded step takes the longer of its memory traffic at the host's bandwidth and its arithmetic at the rate
the framework's own CPU Adam reaches on that host (host.cpu_adam_params_per_s, which advisor calibrate
measures; the framework record's cpu_adam names which)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.cost.estimate import estimate
from advisor.cost.optimizer_step import ADAM_BYTES_PER_PARAM
from advisor.errors import AdvisorError
from advisor.search import Pins
from advisor.search.enumerate import search
from advisor.space.strategy import Strategy
from advisor.specs.hardware import hardware_from_dict, load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

A100 = load_hardware("dgx-a100-80g")
MODEL = load_model("llama3-8b")
CLUSTER = Cluster.of(A100, nodes=1)
# ZeRO-1 over the node's 8 devices, every optimizer state on the host: the host steps the whole model
OFFLOADED = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1, offload_optimizer=True)


def _with_rates(hw, **rates):
    return replace(hw, host=replace(hw.host, cpu_adam_params_per_s=tuple(sorted(rates.items()))))


def _offload_s(hw, framework: str = "megatron") -> float:
    job = TrainingJob(global_batch_size=32, seq_length=4096, framework=framework)
    return estimate(MODEL, hw, CLUSTER, job, OFFLOADED).time_s["offload"]


def test_a_slow_cpu_adam_sets_the_offloaded_step():
    base = _offload_s(A100)                                  # no measured rate: the host's memory traffic alone
    slow, slower = (_offload_s(_with_rates(A100, torch=rate)) for rate in (2e8, 1e8))
    # both compute-bound: the difference is the parameters the one host steps over the two rates
    on_host = (slower - slow) / (1 / 1e8 - 1 / 2e8)
    assert on_host == pytest.approx(MODEL.num_params, rel=1e-6)
    host_bw = (A100.host.memory_bandwidth_gbps or A100.host.pcie_bandwidth_gbps * 8) * 1e9
    assert slow - base == pytest.approx(on_host / 2e8 - on_host * ADAM_BYTES_PER_PARAM / host_bw, rel=1e-6)
    # a rate beyond what the memory traffic allows changes nothing: the roofline's other side
    assert _offload_s(_with_rates(A100, torch=1e15)) == pytest.approx(base, rel=1e-12)


def test_each_framework_steps_with_its_own_cpu_adam():
    deepspeed_only = _with_rates(A100, deepspeed=1e8)
    assert _offload_s(deepspeed_only, "megatron") == pytest.approx(_offload_s(A100, "megatron"), rel=1e-12)
    assert _offload_s(deepspeed_only, "deepspeed") > 2 * _offload_s(A100, "deepspeed")
    torch_only = _with_rates(A100, torch=1e8)
    assert _offload_s(torch_only, "pytorch") > 2 * _offload_s(A100, "pytorch")


def test_the_search_prices_it_and_its_bound_stays_below():
    """The enumerator's bounds free the host (advisor.search.enumerate_bounds): a slow CPU Adam only makes
    offloaded candidates slower, and the pinned search still returns the exact price of its #1."""
    job = TrainingJob(global_batch_size=32, seq_length=4096)
    slow = _with_rates(A100, torch=5e7)
    pins = Pins(offload_optimizer=True)
    fast_best = search(MODEL, A100, CLUSTER, job, pins, 1, None).finalists
    slow_best = search(MODEL, slow, CLUSTER, job, pins, 1, None).finalists
    fast_s, slow_s = (estimate(MODEL, hw, CLUSTER, job, b.strategy(0)).step_time_s for hw, b in
                      ((A100, fast_best), (slow, slow_best)))
    assert slow_s > fast_s
    # the slow host's #1 is no slower there than the fast host's #1 would be
    assert slow_s <= estimate(MODEL, slow, CLUSTER, job, fast_best.strategy(0)).step_time_s * (1 + 1e-9)


def test_profiles_name_a_known_cpu_adam_with_a_positive_rate():
    raw = dict(A100.raw)
    for value, needle in (({"numpy": 1e9}, "unknown CPU Adam 'numpy'"), ({"torch": -1}, "torch"),
                          ([1e9], "must map a CPU Adam")):
        with pytest.raises(AdvisorError, match=needle):
            hardware_from_dict({**raw, "host": {**raw["host"], "cpu_adam_params_per_s": value}}, "p.yaml")
    hw = hardware_from_dict({**raw, "host": {**raw["host"], "cpu_adam_params_per_s": {"torch": 4e9}}}, "p.yaml")
    assert hw.host.cpu_adam_rate("torch") == 4e9 and hw.host.cpu_adam_rate("mindspore") is None


def test_recommend_offloads_the_optimizer_only_where_nothing_fits_without_it():
    """Issue 30: "#1 uses CPU offload only where nothing fits without it". No measured run uses optimizer offload,
    so its price is the one the model knows least; plans without it rank first, offloaded ones only follow."""
    from advisor.commands.recommend import recommend
    from advisor.cost.band import memory_headroom
    from advisor.validation.accuracy import run_hardware, usable_runs

    # MPT-30B on one H100 node (llm-foundry's table): an offloaded plan is priced a quarter faster than the best
    # without, and the measured FSDP run needs none
    run = next(r for r in usable_runs() if r.id == "foundry-h100-bf16-mpt-30b-s4096-g8-mbs1-gbs168")
    hw = run_hardware(run)
    cluster = Cluster.of(hw, devices=run.devices)
    job = replace(run.job, memory_margin=memory_headroom())
    result = recommend(run.model, hw, cluster, job, top_k=5)
    assert not result.best.strategy.offload_optimizer
    offloaded = recommend(run.model, hw, cluster, job, pins=Pins(offload_optimizer=True), top_k=1).estimates[0]
    assert offloaded.tokens_per_s > 1.1 * result.estimates[0].tokens_per_s
    offloading = [p.strategy.offload_optimizer for p in result.plans]
    assert offloading == sorted(offloading)            # any offloaded plan after every one without
    assert [p.search["rank"] for p in result.plans] == list(range(1, len(result.plans) + 1))
    # llama3-70b on one H100 node: nothing fits without offload, so the #1 offloads
    h100 = load_hardware("dgx-h100")
    seventy = load_model("llama3-70b")
    small = TrainingJob(global_batch_size=16, seq_length=4096, framework="pytorch")
    with pytest.raises(AdvisorError):
        recommend(seventy, h100, Cluster.of(h100, nodes=1), small, pins=Pins(offload_optimizer=False), top_k=1)
    assert recommend(seventy, h100, Cluster.of(h100, nodes=1), small, top_k=1).best.strategy.offload_optimizer
