"""--from FILE (advisor.importers): a Megatron-LM launch or a torchtitan TOML that advisor exports reads back as the
same plan at the same price, and a flag advisor does not price is refused naming the file, the flag and its value."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.commands.estimate_request import estimate_request
from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.importers import read_launch_config
from advisor.search import Pins
from advisor.space.strategy import Strategy

SETTINGS = [
    ("llama3-70b", "dgx-h100", 64, {}),                                   # interleaved, ZeRO-1, offload
    ("llama3-8b", "dgx-h100", 16, {"dtype": "fp8"}),
    ("llama3-8b", "dgx-b200", 16, {"dtype": "fp8", "fp8_recipe": "nvfp4"}),   # --fp4-format e2m1
    ("mixtral-8x7b", "dgx-h100", 32, {}),                                 # experts, dropless
    ("gpt3-175b", "dgx-a100-80g", 64, {"dropout": True}),
    ("llama3-8b", "dgx-h100", 8, {"grad_reduce_dtype": "bf16"}),
]


def _resolved(s, model):
    return replace(s, stage_layers=tuple(s.resolved_stage_layers(model.num_layers)))


@pytest.mark.parametrize("model,hardware,devices,job", SETTINGS)
def test_an_exported_plan_reads_back_at_the_same_price(tmp_path, model, hardware, devices, job):
    i = resolve_inputs(model, hardware, devices=devices, **job)
    for plan in recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=2).plans:
        script = tmp_path / "launch.sh"
        script.write_text(export_plan(plan, "megatron").files["megatron_pretrain_gpt.sh"])
        back = estimate_request(model, hardware, None, None, job={}, strategy={}, launch=str(script))
        assert _resolved(back.strategy, i.model) == _resolved(plan.strategy, i.model), (back.strategy, plan.strategy)
        assert replace(back.inputs.job, fp8_recipe=back.inputs.job.recipe) == replace(plan.training,
                                                                                      fp8_recipe=plan.training.recipe)
        assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)


def test_uneven_interleaved_layout_reads_back(tmp_path):
    """The Llama 3.1 405B recipes' split: 126 layers over pp 8 x vpp 8, the embedding and loss counted."""
    script = tmp_path / "args.txt"
    script.write_text("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 2 "
                      "--num-virtual-stages-per-pipeline-rank 8 --account-for-embedding-in-pipeline-split "
                      "--account-for-loss-in-pipeline-split --sequence-parallel --use-distributed-optimizer "
                      "--micro-batch-size 1 --global-batch-size 256 --seq-length 8192 --bf16 "
                      "--attention-dropout 0.0 --hidden-dropout 0.0 --num-layers 126 --untie-embeddings-and-output-weights "
                      "--disable-bias-linear")
    r = estimate_request("llama3-405b", "dgx-h100", None, 512, job={}, strategy={}, launch=str(script))
    assert r.strategy.stage_layers == (15, 16, 16, 16, 16, 16, 16, 15)
    assert r.strategy.virtual_pipeline_stages == 8 and r.strategy.pipeline_schedule == "interleaved-1f1b"
    assert r.strategy.dp == 4 and r.strategy.zero_stage == 1 and r.estimate.tokens_per_s > 0


def test_flags_given_override_the_file(tmp_path):
    script = tmp_path / "args.txt"
    script.write_text("--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 64 --bf16 "
                      "--attention-dropout 0.0 --hidden-dropout 0.0")
    r = estimate_request("llama3-8b", "dgx-h100", None, 8, job={"dtype": "fp8"}, strategy={"tp": 4},
                         launch=str(script))
    assert r.strategy.tp == 4 and r.inputs.job.dtype == "fp8"


@pytest.mark.parametrize("text, words", [
    ("--tensor-model-parallel-size 2 --foo-bar 3", ["--foo-bar", "3", "does not price"]),
    ("--tensor-model-parallel-size two", ["--tensor-model-parallel-size", "two", "integer"]),
    ("--tensor-model-parallel-size 2 --tensor-model-parallel-size 4", ["given twice"]),
    ("--attention-backend local", ["--attention-backend", "local"]),
    ("--cp-comm-type a2a+p2p", ["--cp-comm-type", "a2a+p2p"]),
    ("--num-layers 40 --tensor-model-parallel-size 2", ["num_layers = 40", "llama3-8b has 32"]),
    ("--tensor-model-parallel-size 2 --pipeline-model-parallel-layout 'E(tt|)*2L'", ["layout", "E(tt"]),
])
def test_what_advisor_cannot_price_is_refused_naming_the_file_and_flag(tmp_path, text, words):
    _refused(tmp_path / "bad.sh", text, words)


def _refused(path, text: str, words: list[str]) -> None:
    """One sentence naming the file and each of ``words``."""
    path.write_text(text)
    with pytest.raises(AdvisorError) as err:
        estimate_request("llama3-8b", "dgx-h100", None, 8, job={}, strategy={}, launch=str(path))
    message = str(err.value)
    assert path.name in message and all(w in message for w in words), message


def test_a_file_of_another_kind_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(AdvisorError, match="notes.txt.*none of a Megatron-LM argument list.*DeepSpeed.*MindFormers"):
        read_launch_config(other)


# ---- torchtitan ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model,hardware,devices,job", [
    ("llama3-70b", "dgx-h100", 64, {}), ("llama3-8b", "dgx-h100", 16, {"dtype": "fp8"}),
    ("llama3-70b", "dgx-h100", 64, {"global_batch_size": 64, "seq_length": 4096}),
])
def test_an_exported_torchtitan_toml_reads_back_at_the_same_price(tmp_path, model, hardware, devices, job):
    i = resolve_inputs(model, hardware, devices=devices, framework="torchtitan", **job)
    for plan in recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=2).plans:
        toml = tmp_path / "job.toml"
        toml.write_text(export_plan(plan, "torchtitan").files["torchtitan.toml"])
        back = estimate_request(model, hardware, None, None, job={}, strategy={}, launch=str(toml))
        assert _resolved(back.strategy, i.model) == _resolved(plan.strategy, i.model), (back.strategy, plan.strategy)
        assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)


def test_a_pipelined_torchtitan_toml_reads_its_parts(tmp_path):
    toml = tmp_path / "pp.toml"
    parts = [["tok_embeddings"] + [f"layers.{i}" for i in range(0, 9)], [f"layers.{i}" for i in range(9, 20)],
             [f"layers.{i}" for i in range(20, 30)], [f"layers.{i}" for i in range(30, 32)] + ["norm", "output"]]
    toml.write_text("[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 1\n"
                    "pipeline_parallel_degree = 2\npipeline_parallel_schedule = \"Interleaved1F1B\"\n"
                    f"module_fqns_per_model_part = {parts!r}\n".replace("'", '"')
                    + "[training]\nlocal_batch_size = 8\nglobal_batch_size = 32\nseq_len = 4096\n"
                    + "[activation_checkpoint]\nmode = \"full\"\n[job]\ndump_folder = \"./out\"\n")
    r = estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=str(toml))
    s = r.strategy
    assert (s.dp, s.pp, s.virtual_pipeline_stages, s.zero_stage, s.recompute) == (4, 2, 2, 3, "full")
    assert s.stage_layers == (19, 13) and s.pipeline_schedule == "interleaved-1f1b"


@pytest.mark.parametrize("text, words", [
    ("[parallelism]\ndata_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n", ["HSDP"]),
    ("[training]\nmixed_precision_reduce = \"bfloat16\"\n", ["mixed_precision_reduce", "bfloat16"]),
    ("[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"2\"\n", ["selective (2)"]),
    ("[parallelism]\nwarp_drive = true\n", ["parallelism.warp_drive"]),
    ("[mystery]\nx = 1\n", ["[mystery]"]),
    ("[parallelism\n", ["not a TOML file"]),
])
def test_a_torchtitan_key_advisor_cannot_price_is_refused(tmp_path, text, words):
    _refused(tmp_path / "bad.toml", text, words)


def test_recommend_from_a_launch_pins_what_it_pins(tmp_path):
    """recommend --from FILE: the file's degrees and knobs pinned, the rest searched; the exported plan itself is
    among the candidates, so the best is at least as fast."""
    import json
    import subprocess
    import sys

    from advisor.cost.band import memory_headroom

    # the plan as `advisor recommend` finds it: leaving the memory band's headroom free
    i = resolve_inputs("llama3-8b", "dgx-h100", devices=16, memory_margin=memory_headroom())
    default = Strategy(dp=1)
    plan = next(p for p in recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=5).plans
                if len(set(p.strategy.stage_layers or (0,))) == 1 and p.strategy.mesh_order == default.mesh_order)  # --from pins these
    script = tmp_path / "launch.sh"
    script.write_text(export_plan(plan, "megatron").files["megatron_pretrain_gpt.sh"])
    r = subprocess.run([sys.executable, "-m", "advisor", "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                        "--from", str(script), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["plans"][0]
    for key in ("dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size"):
        assert best["parallel"][key] == getattr(plan.strategy, key), key
    assert best["prediction"]["tokens_per_s"] >= plan.prediction["tokens_per_s"] * (1 - 1e-9)


def test_torch_compile_is_read_and_written_for_torchtitan(tmp_path):
    """[compile] enable (torchtitan 0.2) is the fused_kernels setting (--fused-kernels): the export writes it from the
    setting's record and the TOML reads back at the same price; an eager Megatron-LM plan is refused."""
    i = resolve_inputs("llama3-8b", "dgx-h100", devices=16, framework="torchtitan", fused_kernels=True)
    plan = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=1).plans[0]
    text = export_plan(plan, "torchtitan").files["torchtitan.toml"]
    assert "[compile]\nenable = true" in text
    toml = tmp_path / "job.toml"
    toml.write_text(text)
    back = estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=str(toml))
    assert back.inputs.job.fused_kernels is True
    assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-12)
    eager = estimate_request("llama3-8b", "dgx-h100", None, 16, job={"framework": "torchtitan"}, strategy={})
    assert eager.estimate.tokens_per_s < back.estimate.tokens_per_s       # unfused memory-bound kernels cost time
    with pytest.raises(AdvisorError, match="framework megatron does not run it"):
        estimate_request("llama3-8b", "dgx-h100", None, 16, job={"fused_kernels": False}, strategy={})
    _refused(tmp_path / "bad.toml", "[compile]\nenable = true\nbackend = \"eager\"\n", ["compile.backend", "eager"])


def test_torchtitan_shards_over_context_parallel_ranks(tmp_path):
    """torchtitan applies FSDP over dp_shard x cp whenever cp > 1 (ParallelDims.fsdp_enabled): a TOML with
    data_parallel_shard_degree 1 and cp 4 is ZeRO over the 4 cp ranks, and a replicated (ZeRO-0) plan with cp > 1 is
    not one torchtitan runs."""
    toml = tmp_path / "cp.toml"
    toml.write_text("[parallelism]\ndata_parallel_shard_degree = 1\ncontext_parallel_degree = 4\n"
                    "tensor_parallel_degree = 2\n[training]\nlocal_batch_size = 1\nglobal_batch_size = 8\n"
                    "seq_len = 8192\n")
    r = estimate_request("llama3-8b", "dgx-h100", None, None, job={}, strategy={}, launch=str(toml))
    assert (r.strategy.dp, r.strategy.cp, r.strategy.zero_stage) == (1, 4, 3)
    with pytest.raises(AdvisorError, match="ZeRO >= 1 with cp > 1"):
        estimate_request("llama3-8b", "dgx-h100", None, 8, job={"framework": "torchtitan", "seq_length": 8192},
                         strategy={"cp": 2, "zero_stage": 0})
