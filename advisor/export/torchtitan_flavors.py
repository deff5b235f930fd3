"""torchtitan's own model flavors (``[model] name`` and ``flavor``), so that an export can name the architecture it
priced instead of leaving it to the user.

Transcribed from torchtitan v0.2.0: torchtitan/models/llama3/__init__.py ``llama3_args`` (TransformerModelArgs,
llama3/model/args.py: vocab_size 128256 by default) and torchtitan/models/qwen3/__init__.py ``qwen3_args``
(Qwen3ModelArgs, qwen3/model/args.py: enable_weight_tying False by default), each flavor's arguments as written
there; tests/test_export_torchtitan.py compares them with the installed package's source. DeepSeek-V3's 671B flavor
is left out: it runs FlexAttention with a block-causal mask and group-limited routing, which the torchtitan record
does not price.
"""

from __future__ import annotations

from typing import Any

# (model name, flavor) -> the flavor's arguments as torchtitan v0.2.0 writes them (defaults filled in)
FLAVORS: dict[tuple[str, str], dict[str, Any]] = {
    ("llama3", "8B"): {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
                       "multiple_of": 1024, "vocab_size": 128256},
    ("llama3", "70B"): {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
                        "multiple_of": 4096, "vocab_size": 128256},
    ("llama3", "405B"): {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
                         "multiple_of": 4096, "vocab_size": 128256},
    ("qwen3", "8B"): {"vocab_size": 151936, "head_dim": 128, "dim": 4096, "n_layers": 36, "n_heads": 32,
                      "n_kv_heads": 8, "hidden_dim": 12288},
    ("qwen3", "14B"): {"vocab_size": 151936, "head_dim": 128, "dim": 5120, "n_layers": 40, "n_heads": 40,
                       "n_kv_heads": 8, "hidden_dim": 17408},
    ("qwen3", "32B"): {"vocab_size": 151936, "head_dim": 128, "dim": 5120, "n_layers": 64, "n_heads": 64,
                       "n_kv_heads": 8, "hidden_dim": 25600},
    ("qwen3", "30B-A3B"): {"vocab_size": 151936, "head_dim": 128, "dim": 2048, "n_layers": 48, "n_heads": 32,
                           "n_kv_heads": 4, "hidden_dim": 6144, "moe_enabled": True, "moe_inter_dim": 768,
                           "num_experts": 128, "num_shared_experts": 0, "top_k": 8},
    ("qwen3", "235B-A22B"): {"vocab_size": 151936, "head_dim": 128, "dim": 4096, "n_layers": 94, "n_heads": 64,
                             "n_kv_heads": 4, "hidden_dim": 12288, "moe_enabled": True, "moe_inter_dim": 1536,
                             "num_experts": 128, "num_shared_experts": 0, "top_k": 8},
}


def _llama_ffn(dim: int, multiplier: float | None, multiple_of: int) -> int:
    """torchtitan's Llama feed-forward width (llama3/model/model.py FeedForward, v0.2.0): two thirds of 4 x dim,
    times the multiplier, rounded up to a multiple."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def shape(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A flavor's architecture in advisor's ModelSpec terms (what check_model compares): every layer is dense
    (Llama 3, dense Qwen3) or every layer MoE (Qwen3-MoE, decoder_sparse_step 1); SwiGLU, RMSNorm, rotary, no
    biases, untied embeddings, no latent attention, no window."""
    dim, heads = args["dim"], args["n_heads"]
    out: dict[str, Any] = {
        "num_layers": args["n_layers"], "hidden_size": dim, "num_attention_heads": heads,
        "num_kv_heads": args["n_kv_heads"], "vocab_size": args["vocab_size"], "head_dim": args.get("head_dim", dim // heads),
        "ffn_activation": "swiglu", "norm": "rmsnorm", "use_bias": False, "position_embedding": "rotary",
        "tie_embeddings": False, "mla": None, "sliding_window": None,
    }
    if name == "llama3":
        out["ffn_hidden_size"] = _llama_ffn(dim, args.get("ffn_dim_multiplier"), args["multiple_of"])
    elif not args.get("moe_enabled"):
        out["ffn_hidden_size"] = args["hidden_dim"]
    out["moe"] = None if not args.get("moe_enabled") else {
        "num_experts": args["num_experts"], "top_k": args["top_k"], "expert_ffn_hidden_size": args["moe_inter_dim"],
        "num_shared_experts": args["num_shared_experts"], "first_k_dense_layers": 0}
    return out


def model_shape(model) -> dict[str, Any]:
    """The same fields of an advisor ModelSpec."""
    out = {k: getattr(model, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                                          "vocab_size", "head_dim", "ffn_activation", "norm", "use_bias",
                                          "position_embedding", "tie_embeddings", "sliding_window")}
    out["mla"] = None if model.mla is None else "mla"
    if model.moe is None or model.moe.first_k_dense_layers or model.moe.layer_frequency != 1:
        out["ffn_hidden_size"] = model.ffn_hidden_size
    m = model.moe
    out["moe"] = None if m is None else {
        "num_experts": m.num_experts, "top_k": m.top_k, "expert_ffn_hidden_size": m.expert_ffn_hidden_size,
        "num_shared_experts": m.num_shared_experts, "first_k_dense_layers": m.first_k_dense_layers}
    return out


def flavor_of(model) -> tuple[str, str] | None:
    """The torchtitan (name, flavor) whose architecture is exactly the model's, or None."""
    want = model_shape(model)
    for key, args in FLAVORS.items():
        if shape(key[0], args) == want:
            return key
    return None
