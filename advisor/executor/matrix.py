"""The validation matrix: hand-written plans (DESIGN's plan schema) for tiny models of several
families, one per plan shape, used by the tests and by benchmarks/executor_matrix.py.

Every shape of the issue's matrix appears with and without recomputation: dp, ZeRO 1/2/3, tp,
tp+sp, pp with GPipe / 1F1B / interleaved 1F1B, dp x tp, pp x dp, pp x tp, pp x dp x tp, and context
parallelism alone and with dp, tp and pp. The model
families rotate (GPT-style: GELU, LayerNorm, learned positions, biases, tied embeddings;
Llama-style: SwiGLU, RMSNorm, rotary, GQA) and so does the attention (math, flash).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from advisor.specs.bundled import bundled_dir

PROFILES = bundled_dir("hardware_profiles")

GPT_STYLE = dict(name="tiny-gpt", source="executor test matrix", num_layers=4, hidden_size=64,
                 num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=256, ffn_activation="gelu",
                 vocab_size=256, seq_length=32, tie_embeddings=True, norm="layernorm", use_bias=True,
                 position_embedding="learned")
LLAMA_STYLE = dict(name="tiny-llama", source="executor test matrix", num_layers=4, hidden_size=64,
                   num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=176, ffn_activation="swiglu",
                   vocab_size=256, seq_length=32, tie_embeddings=False, norm="rmsnorm", use_bias=False,
                   position_embedding="rotary")
FAMILIES = {"gpt": GPT_STYLE, "llama": LLAMA_STYLE}


def hardware_dict(name: str = "dgx-a100-80g") -> dict[str, Any]:
    return yaml.safe_load((PROFILES / f"{name}.yaml").read_text())


def tiny_plan(parallel: dict[str, Any], family: str = "llama", attention: str = "math",
              model: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
              hardware: str = "dgx-a100-80g") -> dict[str, Any]:
    """A complete schema-1 plan for a tiny model; unspecified parallel knobs take their defaults."""
    m = copy.deepcopy(FAMILIES[family])
    m.update(model or {})
    par = dict(dp=1, tp=1, pp=1, cp=1, ep=1, sequence_parallel=False, virtual_pipeline_stages=1,
               micro_batch_size=2, num_micro_batches=2, zero_stage=0, recompute="none", recompute_layers=None,
               pipeline_schedule="1f1b", stage_layers=None, mesh_order=["pp", "dp", "cp", "tp"],
               offload_optimizer=False)
    par.update(parallel)
    if par["stage_layers"] is None:
        base, extra = divmod(m["num_layers"], par["pp"])
        par["stage_layers"] = [base + (1 if i < extra else 0) for i in range(par["pp"])]
    devices = par["dp"] * par["tp"] * par["pp"] * par["cp"]
    train = dict(global_batch_size=par["dp"] * par["micro_batch_size"] * par["num_micro_batches"],
                 seq_length=m["seq_length"], dtype="fp32", optimizer="adamw", attention=attention)
    train.update(training or {})
    return {"schema_version": 1, "advisor_version": "0.1.0", "model": m, "hardware": hardware_dict(hardware),
            "cluster": {"nodes": 1, "devices": devices}, "training": train, "parallel": par,
            "operator_strategies": None, "prediction": None, "search": None}


def layout_plan(parallel: dict[str, Any], mesh: list[int], cuts: dict[str, list[str | None]], family: str = "llama",
                attention: str = "math", model: dict[str, Any] | None = None,
                training: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tiny plan with an operator layout (the record advisor.search.intra_op writes, in the parts the executor
    reads): the tensor-parallel group's ``mesh`` and, per operator named as in the graph's layer template
    (``qkv``, ``fc1``, ...; ``embed``, ``lnf``, ``head``, ``loss`` for the ends), the label each mesh axis cuts."""
    plan = tiny_plan(parallel, family, attention, model, training)
    ends = ("embed", "lnf", "head", "loss")
    plan["operator_strategies"] = {
        "searcher": "test", "layout": "searched", "mesh": list(mesh),
        "operators": {(op if op in ends else f"layer.{op}"): {"mesh_axes": list(axes)} for op, axes in cuts.items()}}
    return plan


# operator layouts as D-Rec and the ILP write them, away from Megatron's cut on every operator kind: batch,
# sequence, hidden, head, FFN and vocabulary cuts, row cuts that leave partial sums, two-axis meshes
LAYOUT_2D = {"embed": ["v", "h"], "ln1": ["s", "s"], "qkv": ["h", "g"], "attn": ["s", "g"], "proj": ["s", "g"],
             "res1": ["s", "s"], "ln2": ["b", "s"], "fc1": ["f", "h"], "fc2": ["f", "f"], "res2": ["s", "b"],
             "lnf": ["s", None], "head": ["v", "h"], "loss": ["v", "s"]}
LAYOUT_1D = {"ln1": ["s"], "qkv": ["h"], "attn": ["s"], "proj": ["s"], "res1": ["b"], "ln2": ["s"], "fc1": ["h"],
             "fc2": ["f"], "res2": ["s"]}
LAYOUTS: dict[str, dict[str, Any]] = {
    "layout 2x2": layout_plan(dict(tp=4), [2, 2], LAYOUT_2D, "llama", "math", model=dict(num_kv_heads=4)),
    "layout 2x2 gpt": layout_plan(dict(tp=4), [2, 2], LAYOUT_2D, "gpt", "flash"),
    "layout pp×tp": layout_plan(dict(tp=2, pp=2, num_micro_batches=4), [2], LAYOUT_1D, "gpt", "math"),
    "layout dp×tp zero1": layout_plan(dict(tp=2, dp=2, zero_stage=1), [2], LAYOUT_1D, "llama", "flash"),
}


PP2 = dict(pp=2, num_micro_batches=4)
INTERLEAVED = dict(pp=2, num_micro_batches=4, virtual_pipeline_stages=2, pipeline_schedule="interleaved-1f1b")

# name -> (parallel knobs, family, attention). Each shape twice: without and with recomputation.
MATRIX: dict[str, tuple[dict[str, Any], str, str]] = {
    "dp": (dict(dp=2), "gpt", "math"),
    "dp+full": (dict(dp=2, recompute="full"), "llama", "flash"),
    "zero1": (dict(dp=2, zero_stage=1), "llama", "math"),
    "zero1+selective": (dict(dp=2, zero_stage=1, recompute="selective"), "gpt", "math"),
    "zero2": (dict(dp=2, zero_stage=2), "gpt", "flash"),
    "zero2+full": (dict(dp=2, zero_stage=2, recompute="full"), "llama", "math"),
    "zero3": (dict(dp=2, zero_stage=3), "llama", "math"),
    "zero3+selective": (dict(dp=2, zero_stage=3, recompute="selective"), "gpt", "math"),
    "tp": (dict(tp=2), "gpt", "math"),
    "tp+selective": (dict(tp=2, recompute="selective"), "llama", "math"),
    "tp+sp": (dict(tp=2, sequence_parallel=True), "llama", "flash"),
    "tp+sp+full": (dict(tp=2, sequence_parallel=True, recompute="full"), "gpt", "math"),
    "pp-gpipe": (dict(PP2, pipeline_schedule="gpipe"), "gpt", "math"),
    "pp-gpipe+full": (dict(PP2, pipeline_schedule="gpipe", recompute="full", recompute_layers=1), "llama", "math"),
    "pp-1f1b": (dict(PP2), "llama", "math"),
    "pp-1f1b+selective": (dict(PP2, recompute="selective"), "gpt", "math"),
    "pp-interleaved": (dict(INTERLEAVED), "gpt", "math"),
    "pp-interleaved+full": (dict(INTERLEAVED, recompute="full"), "llama", "flash"),
    "dp×tp": (dict(dp=2, tp=2, sequence_parallel=True), "llama", "math"),
    "dp×tp+full": (dict(dp=2, tp=2, zero_stage=3, recompute="full"), "gpt", "math"),
    "pp×dp": (dict(PP2, dp=2, zero_stage=1), "gpt", "math"),
    "pp×dp+selective": (dict(PP2, dp=2, zero_stage=3, recompute="selective"), "llama", "math"),
    "pp×tp": (dict(PP2, tp=2, sequence_parallel=True), "gpt", "math"),
    "pp×tp+full": (dict(INTERLEAVED, tp=2, recompute="full"), "llama", "math"),
    "pp×dp×tp": (dict(PP2, dp=2, tp=2, zero_stage=2, sequence_parallel=True), "llama", "math"),
    "pp×dp×tp+selective": (dict(PP2, dp=2, tp=2, recompute="selective", mesh_order=["dp", "pp", "cp", "tp"]),
                           "gpt", "math"),
    # many micro-batches: the first stage keeps each one's tokens, not the whole step's (a data loader's split)
    "pp-many-micro-batches": (dict(pp=2, num_micro_batches=32), "gpt", "math"),
    # context parallelism: ring attention, a fused kernel (flash), the sequence in 2 x cp chunks
    "cp": (dict(cp=2), "llama", "flash"),
    "cp+full": (dict(cp=2, recompute="full"), "gpt", "flash"),
    "dp×cp": (dict(dp=2, cp=2, zero_stage=1), "gpt", "flash"),
    # context parallelism as Ulysses all-to-alls (Megatron's --cp-comm-type a2a): GQA heads, and with tp + sp
    "cp-a2a": (dict(cp=2, cp_comm="a2a"), "llama", "flash"),
    "cp×tp-a2a+sp": (dict(cp=2, tp=2, cp_comm="a2a", sequence_parallel=True), "gpt", "math"),
    "dp×cp+selective": (dict(dp=2, cp=2, zero_stage=3, recompute="selective", mesh_order=["pp", "cp", "dp", "tp"]),
                        "llama", "flash"),
    "cp×tp": (dict(cp=2, tp=2, sequence_parallel=True), "gpt", "flash"),
    "cp×tp+full": (dict(cp=2, tp=2, dp=2, zero_stage=2, recompute="full"), "llama", "flash"),
    "pp×cp": (dict(PP2, cp=2), "llama", "flash"),
    "pp×cp+full": (dict(INTERLEAVED, cp=2, recompute="full"), "gpt", "flash"),
}


def scaled_family(family: str, scale: int) -> dict[str, Any]:
    """The family's tiny model with head size, FFN width and sequence length times ``scale``
    (what ``--tiny-scale`` does to a plan's --tiny model)."""
    m = FAMILIES[family]
    return {"hidden_size": m["hidden_size"] * scale, "ffn_hidden_size": m["ffn_hidden_size"] * scale,
            "seq_length": m["seq_length"] * scale}


def matrix_plans(names=None, scale: int = 1) -> dict[str, dict[str, Any]]:
    chosen = names or list(MATRIX)
    return {name: tiny_plan(MATRIX[name][0], MATRIX[name][1], MATRIX[name][2],
                            model=scaled_family(MATRIX[name][1], scale) if scale != 1 else None)
            for name in chosen}


def bundled_model_plan(model: str, parallel: dict[str, Any], training: dict[str, Any],
                       hardware: str = "dgx-h100") -> dict[str, Any]:
    """A plan for a bundled model (models/NAME.yaml) with the given knobs (for --tiny checks)."""
    from advisor.specs.model import MODELS_DIR

    par = dict(dp=1, tp=1, pp=1, cp=1, ep=1, sequence_parallel=False, virtual_pipeline_stages=1,
               micro_batch_size=1, num_micro_batches=1, zero_stage=0, recompute="none", recompute_layers=None,
               pipeline_schedule="1f1b", stage_layers=None, mesh_order=["pp", "dp", "cp", "tp"],
               offload_optimizer=False)
    par.update(parallel)
    devices = par["dp"] * par["tp"] * par["pp"] * par["cp"]
    return {"schema_version": 1, "advisor_version": "0.1.0",
            "model": yaml.safe_load((MODELS_DIR / f"{model}.yaml").read_text()), "hardware": hardware_dict(hardware),
            "cluster": {"nodes": 1, "devices": devices}, "training": dict(training), "parallel": par,
            "operator_strategies": None, "prediction": None, "search": None}


LLAMA3_8B_3D = dict(dp=2, tp=2, pp=2, sequence_parallel=True, virtual_pipeline_stages=2, num_micro_batches=8,
                    zero_stage=1, recompute="selective", pipeline_schedule="interleaved-1f1b", stage_layers=[16, 16])


def llama3_8b_plan() -> dict[str, Any]:
    """Llama 3 8B on 8 H100s, dp 2 x tp 2 (sp) x pp 2 interleaved: the --tiny example of the tests."""
    return bundled_model_plan("llama3-8b", LLAMA3_8B_3D,
                              dict(global_batch_size=16, seq_length=8192, dtype="bf16", optimizer="adamw"))
