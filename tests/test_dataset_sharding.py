"""Dataset sharding (issue 13): each rank reads its data-parallel shard, or every rank the whole
global batch (MindSpore full_batch=True); priced as input buffers on the device, host-to-device
copies and the cluster's reads, carried by the plan and written by the exports."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.cost import dataset
from advisor.cost.estimate import estimate
from advisor.cost.memory import GIB
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import load_plan, plan_from_dict, plan_to_dict
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.commands.inputs import resolve_inputs

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs():
    return resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=2, global_batch_size=256, seq_length=4096)


def test_full_batch_reads_dp_times_more_and_holds_it_on_the_device(inputs):
    s = Strategy(dp=8, tp=2, pp=1, micro_batch_size=1, num_micro_batches=32, zero_stage=1)
    full = replace(s, full_batch=True)
    job = replace(inputs.job, framework="mindspore")          # MindSpore sinks a step's samples at once
    b = StrategyBatch.from_strategies([s, full], inputs.model.num_layers)
    sample = (4096 + 1) * 4
    assert dataset.samples_per_step(job, b).tolist() == [32.0, 256.0]
    assert dataset.device_bytes(job, b).tolist() == [2 * 32 * sample, 2 * 256 * sample]
    # Megatron loads one micro-batch at a time: tokens, labels, position ids (int64), loss mask (fp32)
    megatron = 4096 * (8 + 8 + 8 + 4)
    assert dataset.device_bytes(inputs.job, b).tolist() == [2 * 1 * megatron, 2 * 8 * megatron]
    # ... read by tensor-parallel rank 0 of the first and last stages only; MindSpore: every rank
    assert dataset.cluster_read_gb(inputs.job, s, 16) == pytest.approx(32 * megatron * 8 / 1e9)
    assert dataset.cluster_read_gb(job, replace(s, pp=2, dp=4, num_micro_batches=64), 16) == \
        pytest.approx(64 * 4097 * 4 * 16 / 1e9)
    assert dataset.cluster_read_gb(inputs.job, replace(s, pp=4, dp=2, tp=2, num_micro_batches=128), 16) == \
        pytest.approx(128 * megatron * 2 * 2 / 1e9)
    e_shard = estimate(inputs.model, inputs.hardware, inputs.cluster, job, s)
    e_full = estimate(inputs.model, inputs.hardware, inputs.cluster, job, full)
    assert e_full.memory_gib.buffers - e_shard.memory_gib.buffers == pytest.approx(2 * (256 - 32) * sample / GIB)
    assert e_full.input_read_gb_per_step == pytest.approx(256 * sample * 16 / 1e9)
    assert e_shard.input_read_gb_per_step == pytest.approx(32 * sample * 16 / 1e9)
    # a few MB over PCIe hide under a step of seconds
    assert e_full.step_time_s == pytest.approx(e_shard.step_time_s, rel=1e-12)


def test_copies_longer_than_the_step_show_as_host_time(inputs):
    s = Strategy(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=16, zero_stage=1, full_batch=True)
    job = replace(inputs.job, framework="mindspore")
    b = StrategyBatch.from_strategies([s], inputs.model.num_layers)
    copy = dataset.host_copy_s(inputs.hardware, job, b)[0]
    assert copy == pytest.approx(256 * 4097 * 4 / (inputs.hardware.host.pcie_bandwidth_gbps * 1e9))
    assert dataset.exposed_s(inputs.hardware, job, b, np.array([copy / 4]))[0] == pytest.approx(0.75 * copy)
    assert dataset.exposed_s(inputs.hardware, job, b, np.array([copy * 2]))[0] == 0.0


def test_plan_round_trip_and_exports(inputs, tmp_path):
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                            "--global-batch", "256", "--framework", "mindspore", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert plan.strategy.full_batch is False and "full_batch" not in json.loads(out.read_text())["parallel"]
    full = plan_from_dict({**plan_to_dict(plan), "parallel": {**plan_to_dict(plan)["parallel"], "full_batch": True}},
                          "test")
    assert full.strategy.full_batch is True
    assert plan_from_dict(plan_to_dict(full), "again").strategy == full.strategy
    ms = export_plan(full, "mindspore")
    assert "full_batch=True" in ms.files["parallel_context.py"] and "dataset_strategy" not in ms.files["parallel_context.py"]
    mg = export_plan(full, "megatron")
    assert any(u.startswith("parallel.full_batch = true") for u in mg.unsupported)
    assert not any("full_batch" in u for u in export_plan(plan, "megatron").unsupported)


def test_cli_estimate_full_batch(tmp_path):
    args = ["estimate", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2", "--global-batch", "256",
            "--tp", "2", "--framework", "mindspore", "--json"]
    shard = json.loads(runner.invoke(app, args).output)
    full = json.loads(runner.invoke(app, args + ["--full-batch"]).output)
    assert full["input_read_gb_per_step"] == pytest.approx(8 * shard["input_read_gb_per_step"])
    assert full["memory_gib"]["buffers"] > shard["memory_gib"]["buffers"]
    # the plan's strategy read with the whole batch
    plan = tmp_path / "p.json"
    rec = runner.invoke(app, ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                              "--global-batch", "256", "--framework", "mindspore", "--out", str(plan)])
    assert rec.exit_code == 0, rec.output
    base = json.loads(runner.invoke(app, ["estimate", "--plan", str(plan), "--json"]).output)
    with_full = json.loads(runner.invoke(app, ["estimate", "--plan", str(plan), "--full-batch", "--json"]).output)
    dp = json.loads(plan.read_text())["parallel"]["dp"]
    assert with_full["input_read_gb_per_step"] == pytest.approx(dp * base["input_read_gb_per_step"])
    # refused where nothing reads the whole batch
    for extra, words in ((["--model", "llama3-8b", "--framework", "megatron", "--tp", "2"], "full_batch) is MindSpore's"),
                         (["--model", "dlrm-criteo-1tb"], "transformer settings")):
        bad = runner.invoke(app, ["estimate", "--hardware", "dgx-a100-80g", "--nodes", "2", "--full-batch", *extra])
        assert isinstance(bad.exception, AdvisorError) and words in str(bad.exception), bad.output
    r = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1",
                            "--tp", "8", "--pp", "2", "--full-batch"])
    assert isinstance(r.exception, AdvisorError) and r.exception.exit_code == 2
    assert "--full-batch is not available on a mixed cluster" in str(r.exception)


def test_plan_key_refused_where_it_is_not_priced(tmp_path):
    """parallel.full_batch in a mixed-cluster or supernet plan: refused naming the key."""
    for args in (["--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1", "--global-batch", "64"],
                 ["--model", "hat-supernet", "--hardware", "dgx-a100-80g", "--devices", "4"]):
        out = tmp_path / "p.json"
        r = runner.invoke(app, ["recommend", *args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        data = json.loads(out.read_text())
        data["parallel"]["full_batch"] = True
        with pytest.raises(AdvisorError, match="full_batch"):
            plan_from_dict(data, "edited")
        data["training"]["framework"] = "mindspore"          # past the framework rule: the layout refuses it
        with pytest.raises(AdvisorError, match="full_batch"):
            plan_from_dict(data, "edited")


def test_megatron_attention_mask_in_the_loader(inputs):
    """Megatron's loader builds an s x s boolean mask per sample unless told not to: the export turns it
    off for fused attention (what the cost model prices), and unfused attention pays for it."""
    flash = replace(inputs.job, attention="flash")
    math = replace(inputs.job, attention="math")
    assert dataset.sample_bytes(math) - dataset.sample_bytes(flash) == 4096 ** 2
    from _export_plans import plans

    attention = set()
    for name, plan in plans().items():
        args = export_plan(plan, "megatron").files["megatron_pretrain_gpt.sh"]
        assert ("--no-create-attention-mask-in-dataloader" in args) == (plan.training.attention == "flash"), name
        attention.add(plan.training.attention)
    assert attention == {"flash", "math"}
