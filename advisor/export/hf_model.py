"""A plan's model as a Hugging Face ``config.json``: the architecture an export that leaves the model
to the user's code (DeepSpeed) writes, so the launched model is the priced one.

The family is the first of transformers' causal-LM classes that builds the description exactly
(advisor.specs.hf_config reads each family; the keys follow transformers' configuration classes):

* multi-head latent attention: ``deepseek_v3`` (DeepseekV3Config: q/kv LoRA ranks, the head widths,
  n_routed_experts, n_shared_experts of moe_intermediate_size each, first_k_dense_replace);
* routed experts without MLA: ``gpt_oss`` where the linears carry biases (GptOssConfig: experts as
  wide as intermediate_size, every layer MoE, windows by layer_types), ``mixtral`` where every layer is
  MoE with experts as wide as intermediate_size (MixtralConfig; a window on every layer),
  ``qwen3_moe`` otherwise (Qwen3MoeConfig: moe_intermediate_size, decoder_sparse_step, mlp_only_layers
  for the leading dense layers; it adds QK-norm weights advisor does not count); shared experts
  without MLA have no family here;
* dense RMSNorm + rotary + gated MLP: ``llama`` (LlamaConfig: head_dim, attention_bias, mlp_bias),
  ``mistral`` with a window on every layer (MistralConfig), ``qwen3`` with one on every k-th layer
  (Qwen3Config use_sliding_window and layer_types; QK-norm added);
* LayerNorm + learned positions + GELU: ``gpt2`` (GPT2Config n_layer, n_embd, n_head, n_inner,
  n_positions; biases everywhere);
* LayerNorm + rotary + GELU: ``gpt_neox`` (GPTNeoXConfig; biases everywhere, no GQA).

Every written config is read back through advisor.specs.hf_config and compared with the plan's
model field by field: a config that would build another model is never written (``HfModel.why``
says what no family expresses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import hf_config as hf
from advisor.specs.model import ModelSpec, model_from_dict, transformer_to_dict

FILE = "config.json"
# the description's fields that name or document it rather than shape it
_NOT_SHAPE = ("name", "source", "notes", "published_params")


@dataclass(frozen=True)
class HfModel:
    """The config.json mapping of a model (None: no family builds it) and the reason there is none."""

    config: dict[str, Any] | None
    model_type: str | None
    why: str | None = None


def hf_model(model: ModelSpec) -> HfModel:
    """The Hugging Face config of ``model``, checked by reading it back (module docstring)."""
    try:
        model_type, config = _config(model)
    except _NoFamily as exc:
        return HfModel(None, None, str(exc))
    config = {"architectures": list(hf.ARCHITECTURES[model_type][:1]), "model_type": model_type, **config}
    differs = _differences(model, config)
    if differs:
        return HfModel(None, None, f"the {model_type} config would build another model ({differs})")
    return HfModel(config, model_type)


class _NoFamily(Exception):
    pass


def _config(m: ModelSpec) -> tuple[str, dict[str, Any]]:
    if not m.causal:
        raise _NoFamily("it is a bidirectional encoder; transformers' causal-LM families are decoders")
    if m.norm == "layernorm" and m.ffn_activation == "gelu":
        return _gelu_family(m)
    if (m.norm, m.ffn_activation, m.position_embedding) != ("rmsnorm", "swiglu", "rotary"):
        raise _NoFamily(f"no family pairs {m.norm}, {m.ffn_activation} and {m.position_embedding} positions")
    if m.mla is not None:
        return "deepseek_v3", _deepseek(m)
    if m.moe is not None:
        return _moe_family(m)
    if m.sliding_window is None:
        return "llama", {**_llama_shape(m), "attention_bias": m.use_bias, "mlp_bias": m.use_bias}
    _no_bias(m, "a windowed dense model")
    if m.sliding_window_every == 1:
        return "mistral", {**_llama_shape(m), "sliding_window": m.sliding_window}
    return "qwen3", {**_llama_shape(m), "attention_bias": False, **_qwen_window(m)}


def _llama_shape(m: ModelSpec) -> dict[str, Any]:
    out = {
        "num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads, "intermediate_size": m.ffn_hidden_size, "hidden_act": "silu",
        "vocab_size": m.vocab_size, "max_position_embeddings": m.seq_length, "tie_word_embeddings": m.tie_embeddings,
    }
    if m.head_dim_override is not None:
        out["head_dim"] = m.head_dim_override
    return out


def _no_bias(m: ModelSpec, what: str) -> None:
    if m.use_bias:
        raise _NoFamily(f"{what} with biases on its linears has no family here")


def _layer_types(m: ModelSpec) -> list[str]:
    """One attention type per layer: every sliding_window_every-th layer windowed, from layer 0 (gpt-oss's
    default pattern; advisor prices the share of windowed layers, not their places)."""
    k = m.sliding_window_every
    return ["sliding_attention" if m.sliding_window is not None and i % k == 0 else "full_attention"
            for i in range(m.num_layers)]


def _qwen_window(m: ModelSpec) -> dict[str, Any]:
    return {"use_sliding_window": True, "sliding_window": m.sliding_window, "layer_types": _layer_types(m)}


def _moe_family(m: ModelSpec) -> tuple[str, dict[str, Any]]:
    e = m.moe
    if e.num_shared_experts:
        raise _NoFamily("shared experts without multi-head latent attention have no family here (DeepSeek-V3's has MLA)")
    every_layer = e.layer_frequency == 1 and not e.first_k_dense_layers and e.expert_ffn_hidden_size == m.ffn_hidden_size
    if m.use_bias:
        if not every_layer:
            raise _NoFamily("experts with biases (gpt-oss) must be on every layer, as wide as intermediate_size")
        out = {**_llama_shape(m), "attention_bias": True, "num_local_experts": e.num_experts,
               "num_experts_per_tok": e.top_k, "layer_types": _layer_types(m)}
        if m.sliding_window is not None:
            out["sliding_window"] = m.sliding_window
        return "gpt_oss", out
    if every_layer and (m.sliding_window is None or m.sliding_window_every == 1):
        out = {**_llama_shape(m), "num_local_experts": e.num_experts, "num_experts_per_tok": e.top_k,
               "sliding_window": m.sliding_window}
        return "mixtral", out
    out = {**_llama_shape(m), "attention_bias": False, "num_experts": e.num_experts, "num_experts_per_tok": e.top_k,
           "moe_intermediate_size": e.expert_ffn_hidden_size, "decoder_sparse_step": e.layer_frequency,
           "mlp_only_layers": list(range(e.first_k_dense_layers)), "norm_topk_prob": True}
    if m.sliding_window is not None:
        out.update(_qwen_window(m))
    return "qwen3_moe", out


def _deepseek(m: ModelSpec) -> dict[str, Any]:
    a, e = m.mla, m.moe
    out = {**_llama_shape(m), "attention_bias": m.use_bias, "q_lora_rank": a.q_lora_rank or None,
           "kv_lora_rank": a.kv_lora_rank, "qk_nope_head_dim": a.qk_nope_head_dim, "qk_rope_head_dim": a.qk_rope_head_dim,
           "v_head_dim": a.v_head_dim, "head_dim": a.qk_rope_head_dim}
    if m.num_kv_heads != m.num_attention_heads:
        raise _NoFamily("multi-head latent attention has one key and value head per query head")
    if m.sliding_window is not None:
        raise _NoFamily("DeepSeek-V3 has no sliding window")
    if e is None:
        return {**out, "n_routed_experts": 0, "first_k_dense_replace": m.num_layers}
    if e.layer_frequency != 1:
        raise _NoFamily("DeepSeek-V3 puts a MoE block on every layer after the dense ones (moe_layer_freq 1)")
    shared = e.shared_ffn if e.num_shared_experts else None
    if shared is not None and shared != e.expert_ffn_hidden_size:
        raise _NoFamily("DeepSeek-V3's shared experts are as wide as the routed ones (moe_intermediate_size)")
    return {**out, "n_routed_experts": e.num_experts, "num_experts_per_tok": e.top_k,
            "moe_intermediate_size": e.expert_ffn_hidden_size, "n_shared_experts": e.num_shared_experts,
            "first_k_dense_replace": e.first_k_dense_layers, "moe_layer_freq": 1}


def _gelu_family(m: ModelSpec) -> tuple[str, dict[str, Any]]:
    if m.moe is not None or m.mla is not None or m.sliding_window is not None or m.head_dim_override is not None:
        raise _NoFamily("GPT-2 and GPT-NeoX have no experts, latent attention, windows or head_dim of their own")
    if not m.use_bias:
        raise _NoFamily("GPT-2 and GPT-NeoX carry biases on every linear layer")
    if m.num_kv_heads != m.num_attention_heads:
        raise _NoFamily("GPT-2 and GPT-NeoX have no grouped-query attention")
    if m.position_embedding == "learned":
        return "gpt2", {"n_layer": m.num_layers, "n_embd": m.hidden_size, "n_head": m.num_attention_heads,
                        "n_inner": m.ffn_hidden_size, "n_positions": m.seq_length, "vocab_size": m.vocab_size,
                        "activation_function": "gelu_new", "tie_word_embeddings": m.tie_embeddings,
                        # GPT2Config's 50256 names GPT-2's own tokenizer; the user's tokenizer sets them
                        "bos_token_id": None, "eos_token_id": None}
    if m.position_embedding == "rotary":
        return "gpt_neox", {"num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size,
                            "num_attention_heads": m.num_attention_heads, "intermediate_size": m.ffn_hidden_size,
                            "hidden_act": "gelu", "vocab_size": m.vocab_size, "max_position_embeddings": m.seq_length,
                            "tie_word_embeddings": m.tie_embeddings, "attention_bias": True}
    raise _NoFamily(f"no family has LayerNorm with {m.position_embedding} positions")


def _differences(model: ModelSpec, config: dict[str, Any]) -> str:
    """The fields the config, read back, gives differently ('' when it builds the model)."""
    try:
        read = hf.model_from_hf_config(config, FILE, "model")     # the name is not compared (nor written)
        back = model_from_dict(read, FILE)
    except AdvisorError as exc:
        return str(exc)
    want, got = transformer_to_dict(model), transformer_to_dict(back)
    keys = sorted((set(want) | set(got)) - set(_NOT_SHAPE))
    return ", ".join(f"{k} {got.get(k)!r} for {want.get(k)!r}" for k in keys if want.get(k) != got.get(k))
