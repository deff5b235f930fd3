"""The gradient-reduce dtype end to end, from its one declaration (TrainingJob.grad_reduce_dtype's Setting):
the flag on estimate and recommend, the plan JSON, the frameworks that run each value, and what each
export writes or reports."""

from __future__ import annotations

import json

import pytest

from tests._cli import run_cli
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.plan import load_plan, plan_from_dict, plan_to_dict
from advisor.specs.job import TrainingJob

SMALL = ("--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "8", "--gbs", "64", "--seq-len", "2048")


def _estimate(monkeypatch, capsys, *flags):
    code, out, err = run_cli(monkeypatch, capsys, "estimate", *SMALL, "--zero", "1", "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def test_bf16_reduction_halves_the_gradient_buffer_and_the_traffic(monkeypatch, capsys):
    fp32 = _estimate(monkeypatch, capsys, "--grad-reduce-dtype", "fp32")
    bf16 = _estimate(monkeypatch, capsys, "--grad-reduce-dtype", "bf16")
    default = _estimate(monkeypatch, capsys)
    # Megatron keeps its gradient buffer in the reduction dtype (main_grad) and reduces it over dp
    assert bf16["memory_gib"]["gradients"] == pytest.approx(fp32["memory_gib"]["gradients"] / 2)
    assert default["memory_gib"] == fp32["memory_gib"]           # Megatron's default for bf16 models is fp32
    assert 0 < bf16["time_s"]["dp_comm"] < 0.6 * fp32["time_s"]["dp_comm"]


def test_the_plan_keeps_it_and_the_exports_write_or_report_it(monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run_cli(monkeypatch, capsys, "recommend", *SMALL, "--grad-reduce-dtype", "bf16", "--top", "1",
                           "--out", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["training"]["grad_reduce_dtype"] == "bf16"
    plan = load_plan(out)
    assert plan.training.grad_reduce_dtype == "bf16"
    assert plan_from_dict(plan_to_dict(plan), "again") == plan
    megatron = export_plan(plan, "megatron")
    assert "--grad-reduce-in-bf16" in megatron.text()
    assert not any("grad_reduce_dtype" in u for u in megatron.unsupported)
    deepspeed = export_plan(plan, "deepspeed")
    assert json.loads(deepspeed.files["ds_config.json"])["communication_data_type"] == "bf16"
    for target in ("torchtitan", "mindspore"):       # neither runs a bf16 reduction: reported, not dropped
        result = export_plan(plan, target)
        assert [u for u in result.unsupported if u.startswith("training.grad_reduce_dtype = bf16")], target


def test_fp16_models_reduce_in_fp32_with_megatrons_flag():
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend

    i = resolve_inputs("gpt3-1.3b", "dgx-v100", nodes=1, global_batch_size=32, dtype="fp16", grad_reduce_dtype="fp32")
    plan = recommend(i.model, i.hardware, i.cluster, i.job, top_k=1).best
    assert "--accumulate-allreduce-grads-in-fp32" in export_plan(plan, "megatron").text()


@pytest.mark.parametrize("framework, dtype, reduce", [("torchtitan", "bf16", "bf16"), ("mindspore", "bf16", "bf16"),
                                                      ("megatron", "bf16", "fp16"), ("megatron", "fp16", "bf16")])
def test_frameworks_that_do_not_run_a_value_refuse_it(monkeypatch, capsys, framework, dtype, reduce):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g",
                           "--nodes", "1", "--framework", framework, "--dtype", dtype, "--grad-reduce-dtype", reduce)
    assert code == 2 and "--grad-reduce-dtype" in err and f"framework {framework} does not run it" in err
    with pytest.raises(AdvisorError, match="grad_reduce_dtype"):
        TrainingJob(global_batch_size=8, seq_length=2048, framework=framework, dtype=dtype, grad_reduce_dtype=reduce)


def test_a_plan_naming_a_value_its_framework_does_not_run_is_refused(monkeypatch, capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, _ = run_cli(monkeypatch, capsys, "recommend", *SMALL, "--top", "1", "--out", str(out))
    assert code == 0
    raw = json.loads(out.read_text())
    raw["training"].update(framework="torchtitan", grad_reduce_dtype="bf16")
    with pytest.raises(AdvisorError, match="plan.json: training: key 'grad_reduce_dtype' = bf16: framework torchtitan"):
        plan_from_dict(raw, "plan.json")
