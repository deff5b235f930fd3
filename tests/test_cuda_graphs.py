"""CUDA graphs (advisor.cost.cuda_graphs): captured kernels launch as one graph; Megatron-Core's
scope rules are enforced; the setting travels through the CLI and the plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from _cli import run_cli
from advisor.cost.cuda_graphs import ATTENTION_SHARE, MLP_SHARE, captured_share, graph_launches
from advisor.cost.estimate import KERNELS_BACKWARD, KERNELS_FORWARD, estimate
from advisor.errors import AdvisorError
from advisor.plan import plan_from_dict
from advisor.space.rules import violations
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import load_model

MODEL = load_model("gpt3-1.3b")
JOB = TrainingJob(global_batch_size=8, seq_length=2048)
S = Strategy(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)


def _cpu_like(launch_us=10.0):
    """A device whose host pays every launch in line, so host time is the launch count x the launch."""
    hw = load_hardware("dgx-a100-80g")
    return replace(hw, device=replace(hw.device, launch_overhead_us=launch_us, asynchronous_launch=False))


def test_scopes_split_a_layer_as_step_counts_it():
    assert ATTENTION_SHARE + MLP_SHARE == 1.0
    assert captured_share(("full",), False) == 1.0
    assert captured_share(("attn",), False) == ATTENTION_SHARE
    assert captured_share(("attn", "mlp"), False) == 1.0
    assert captured_share(("attn", "moe_router", "moe_preprocess"), True) == 1.0
    assert captured_share(("mlp",), True) == 0.0          # 'mlp' is a dense layer's scope
    assert graph_launches(("attn", "mlp"), False) == 1 and graph_launches(("mlp",), False) == 1
    assert graph_launches((), False) == 0


def test_graphed_kernels_leave_the_host_one_launch_per_region():
    hw = _cpu_like()
    c = Cluster.of(hw, nodes=1)
    eager = estimate(MODEL, hw, c, JOB, S).time_s["host_overhead"]
    attn = estimate(MODEL, hw, c, replace(JOB, cuda_graphs=("attn",)), S).time_s["host_overhead"]
    full = estimate(MODEL, hw, c, replace(JOB, cuda_graphs=("full",)), S).time_s["host_overhead"]
    from advisor.cost.compute import layer_ops_factor

    per_kernel = 10e-6 * layer_ops_factor(MODEL, JOB)
    kernels = KERNELS_FORWARD + KERNELS_BACKWARD
    assert eager == pytest.approx(MODEL.num_layers * kernels * per_kernel)
    assert attn == pytest.approx(MODEL.num_layers * (kernels * MLP_SHARE * per_kernel + 2 * 10e-6))
    assert full == pytest.approx(MODEL.num_layers * 2 * 10e-6)     # one replay forward, one backward


def test_whole_moe_layers_graph_only_with_token_dropping():
    moe = load_model("mixtral-8x7b")
    hw = load_hardware("dgx-h100")
    c = Cluster.of(hw, nodes=4)
    s = Strategy(dp=32, tp=1, pp=1, ep=8, micro_batch_size=1, num_micro_batches=4)
    job = TrainingJob(global_batch_size=128, seq_length=4096, cuda_graphs=("full",))
    assert any("token dropping" in v for v in violations(moe, c, job, s))
    assert not violations(moe, c, replace(job, moe_dropless=False), s)
    assert any("need MoE layers" in v for v in violations(MODEL, Cluster.of(load_hardware("dgx-a100-80g"), nodes=1),
                                                         replace(JOB, cuda_graphs=("attn", "moe_router")), S))


@pytest.mark.parametrize("graphs, framework, message", [
    (("full", "attn"), "megatron", "goes alone"),
    (("moe_preprocess",), "megatron", "needs 'moe_router'"),
    (("moe", "moe_router"), "megatron", "cannot go together"),
    (("attn", "attn"), "megatron", "distinct"),
    (("layer",), "megatron", "distinct names"),
    (("attn",), "torchtitan", "framework megatron"),
])
def test_megatron_core_scope_rules(graphs, framework, message):
    with pytest.raises(AdvisorError, match=message):
        TrainingJob(global_batch_size=8, seq_length=2048, framework=framework, cuda_graphs=graphs)


def test_cli_and_plans_carry_the_graphs(monkeypatch, capsys, tmp_path):
    import json

    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100",
                           "--nodes", "4", "--ep", "8", "--gbs", "128", "--cuda-graphs", "full")
    assert code == 2 and "token dropping" in err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--gbs", "8", "--framework", "torchtitan", "--cuda-graphs", "attn")
    assert code == 2 and "framework megatron" in err
    out = tmp_path / "plan.json"
    code, _, _ = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                         "--devices", "8", "--gbs", "8", "--seq-len", "4096", "--cuda-graphs", "full", "--out", str(out),
                         "--top", "1")
    assert code == 0
    data = json.loads(out.read_text())
    assert data["training"]["cuda_graphs"] == ["full"]
    plan = plan_from_dict(data)
    assert plan.training.cuda_graphs == ("full",)
    # the plan re-prices with its graphs: the same step time as recommend predicted
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--plan", str(out), "--json")
    assert code == 0
    assert json.loads(text)["step_time_s"] == pytest.approx(data["prediction"]["step_time_s"], rel=1e-9)


def test_megatron_moe_layers_launch_one_gemm_per_local_expert():
    """Transformer Engine's grouped GEMM issues one cuBLAS GEMM per local expert (advisor.cost.step
    _moe_launches): 12 + 2 (E - 1) forward and 24 + 4 (E - 1) backward after routing; a moe_preprocess
    graph takes the dispatcher's 2 forward (its counts have no backward), never the experts' GEMMs; other frameworks launch one
    grouped kernel."""
    from advisor.cost.compute import layer_ops_factor

    moe = load_model("mixtral-8x7b")                    # 8 experts, every layer MoE
    hw = _cpu_like(launch_us=10.0)
    c = Cluster.of(hw, nodes=1)
    s = Strategy(dp=8, tp=1, pp=1, ep=2, micro_batch_size=1, num_micro_batches=1)
    job = TrainingJob(global_batch_size=8, seq_length=2048)
    generic = (KERNELS_FORWARD + KERNELS_BACKWARD) * layer_ops_factor(moe, job) * 10e-6
    local = 8 / 2
    eager = estimate(moe, hw, c, job, s).time_s["host_overhead"]
    assert eager == pytest.approx(moe.num_layers * (generic + (12 + 2 * (local - 1) + 24 + 4 * (local - 1)) * 10e-6))
    graphed = estimate(moe, hw, c, replace(job, cuda_graphs=("attn", "moe_router", "moe_preprocess")), s)
    # attention and router in one graph (one replay per pass), the preprocessing's 2 forward launches graphed
    assert graphed.time_s["host_overhead"] == pytest.approx(
        moe.num_layers * (2 + (12 - 2 + 2 * (local - 1)) + (24 + 4 * (local - 1))) * 10e-6)
    titan = estimate(moe, hw, c, replace(job, framework="torchtitan"), s).time_s["host_overhead"]
    titan_generic = (KERNELS_FORWARD + KERNELS_BACKWARD) * layer_ops_factor(moe, replace(job, framework="torchtitan")) * 10e-6
    assert titan == pytest.approx(moe.num_layers * (titan_generic + (12 + 24) * 10e-6))


def test_recomputation_goes_with_the_graphs_megatron_core_allows():
    c = Cluster.of(load_hardware("dgx-a100-80g"), nodes=1)
    full = replace(S, recompute="full")
    assert any("full_iteration" in v for v in violations(MODEL, c, replace(JOB, cuda_graphs=("full",)), full))
    assert violations(MODEL, c, replace(JOB, cuda_graphs=("full_iteration",)), full) == []
    selective = replace(S, recompute="selective")
    assert violations(MODEL, c, replace(JOB, cuda_graphs=("attn",)), selective) == []
    # with dropout, graphed attention is not recomputed (Megatron-Core: no random numbers in a graph replay)
    assert violations(MODEL, c, replace(JOB, cuda_graphs=("attn",), dropout=True), selective)


def test_megatron_export_writes_graphs_only_where_the_release_runs_them():
    from _export_plans import plans
    from advisor.export.megatron import megatron_launch

    plan = plans()["llama8b_cuda_graphs_attn"]
    full_rc = replace(plan, strategy=replace(plan.strategy, recompute="full"),
                      training=replace(plan.training, cuda_graphs=("full_iteration",)))
    launch = megatron_launch(full_rc)
    assert "--cuda-graph-scope" not in launch.args()
    assert any("refuses CUDA graphs with this recomputation" in u for u in launch.unsupported)
    # 0.13's Transformer Engine graphs need --te-rng-tracker (validate_args)
    assert "--te-rng-tracker" in megatron_launch(plan, "0.13").args()


def test_token_dropping_opens_whole_moe_layer_graphs(monkeypatch, capsys, tmp_path):
    import json

    from advisor.export.megatron import megatron_launch

    args = ("--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4", "--gbs", "128", "--seq-len", "4096")
    out = tmp_path / "moe.json"
    code, _, err = run_cli(monkeypatch, capsys, "recommend", *args, "--ep", "8", "--moe-token-drop", "--cuda-graphs",
                           "full", "--top", "1", "--out", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["training"]["moe_dropless"] is False and data["training"]["cuda_graphs"] == ["full"]
    plan = plan_from_dict(data)
    assert not plan.training.moe_dropless
    a = megatron_launch(plan).args()
    assert "--moe-pad-expert-input-to-capacity" in a and a[a.index("--cuda-graph-scope") + 1] == "full"
    # dropless (the default) pays the host synchronization that token dropping avoids
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--plan", str(out), "--json")
    dropped = json.loads(text)["step_time_s"]
    data["training"].pop("moe_dropless")
    data["training"].pop("cuda_graphs")
    out.write_text(json.dumps(data))
    code, text, _ = run_cli(monkeypatch, capsys, "estimate", "--plan", str(out), "--json")
    assert code in (0, 1) and json.loads(text)["step_time_s"] > dropped
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--moe-token-drop")
    assert code == 2 and "no mixture-of-experts" in err


def test_dropout_keeps_graphed_mlp_out_of_recomputation():
    c = Cluster.of(load_hardware("dgx-a100-80g"), nodes=1)
    selective = replace(S, recompute="selective")
    job = replace(JOB, dropout=True, recompute_modules=("mlp",))
    assert violations(MODEL, c, replace(job, cuda_graphs=("mlp",)), selective)
    assert violations(MODEL, c, replace(job, cuda_graphs=("attn",)), selective) == []


def test_exports_write_or_report_the_routing_and_dropout():
    from _export_plans import plans
    from advisor.export import export_plan
    from advisor.export.megatron import megatron_launch

    moe = plans()["mixtral_recompute_modules"]
    dropped = replace(moe, training=replace(moe.training, moe_dropless=False))
    titan = export_plan(dropped, "torchtitan")
    assert any("moe_dropless = false" in u for u in titan.unsupported)
    ds = export_plan(dropped, "deepspeed")
    assert "drop_tokens=True" in "".join(ds.files.values())
    assert "drop_tokens=False" in "".join(export_plan(moe, "deepspeed").files.values())
    # Megatron-LM's 0.1 dropout defaults are turned off for plans priced without dropout
    a = megatron_launch(moe).args()
    assert a[a.index("--attention-dropout") + 1] == "0.0" and a[a.index("--hidden-dropout") + 1] == "0.0"
    gpt3 = plans()["gpt3_gpipe_fp16"]
    assert "--attention-dropout" not in megatron_launch(replace(gpt3, training=replace(gpt3.training, dropout=True))).args()


def test_mixed_plans_refuse_the_job_flags(monkeypatch, capsys, tmp_path):
    out = tmp_path / "mixed.json"
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware",
                           "dgx-a100-80g:1,dgx-h100:1", "--gbs", "32", "--seq-len", "4096", "--top", "1", "--out", str(out))
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--plan", str(out), "--cuda-graphs", "full")
    assert code == 2 and "mixed plan" in err
