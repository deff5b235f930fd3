"""Hugging Face ``config.json`` -> advisor model description (issue #29, "read what people have").

``advisor estimate --model path/to/config.json`` reads the file a Hugging Face checkpoint ships with:
``model_from_hf_config`` turns it into the mapping a models/*.yaml file holds, and
advisor.specs.model.load_model then reads that mapping with the normal reader, so every check of a
model file applies to it as well.

Supported ``model_type`` values (``architectures`` names the class when ``model_type`` is absent):

=============  ===========================  ====================================================
model_type     architectures                what is read besides the common shape keys
=============  ===========================  ====================================================
llama          LlamaForCausalLM             head_dim, attention_bias, mlp_bias
mistral        MistralForCausalLM           head_dim, sliding_window (every layer)
mixtral        MixtralForCausalLM           num_local_experts, num_experts_per_tok (every layer
                                            MoE, intermediate_size is the expert FFN)
qwen2          Qwen2ForCausalLM             use_sliding_window, sliding_window, max_window_layers
qwen3          Qwen3ForCausalLM             head_dim, attention_bias, sliding window keys
qwen3_moe      Qwen3MoeForCausalLM          num_experts, num_experts_per_tok, moe_intermediate_size,
                                            decoder_sparse_step, mlp_only_layers (leading layers
                                            only), no shared experts
deepseek_v3    DeepseekV3ForCausalLM        MLA (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
                                            qk_rope_head_dim, v_head_dim), n_routed_experts,
                                            num_experts_per_tok, moe_intermediate_size,
                                            n_shared_experts, first_k_dense_replace, moe_layer_freq
gpt_oss        GptOssForCausalLM            num_local_experts, experts_per_token /
                                            num_experts_per_tok, head_dim, sliding_window and
                                            layer_types, attention_bias
gpt2           GPT2LMHeadModel              n_layer, n_embd, n_head, n_inner, n_positions,
                                            activation_function (learned positions, LayerNorm, tied)
gpt_neox       GPTNeoXForCausalLM           attention_bias (LayerNorm, rotary, parallel residual)
=============  ===========================  ====================================================

Common shape keys: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads (default:
the heads), intermediate_size (-> ffn_hidden_size), hidden_act (silu in a gated MLP -> swiglu; gelu in
GPT-2 and GPT-NeoX -> gelu), vocab_size, max_position_embeddings (-> seq_length, capped at
limits.MAX_SEQ_LENGTH with a note), tie_word_embeddings (each family's transformers default when
absent). The Llama-derived families get RMSNorm and rotary positions; GPT-2 LayerNorm and learned
positions; GPT-NeoX LayerNorm and rotary positions.

Every key of the file is one of: read (above), accepted as price-neutral (``PRICE_NEUTRAL`` and the
families' own lists, each with the reason it changes neither a shape nor the work of a training
step), or accepted only at the value that leaves the model as described (``_MUST_BE``). Any other key
(an unknown ``model_type`` included) is refused with one sentence naming the file, the key and the
value, so a key that changes the price is never dropped silently; what the importer knowingly does
not count (Qwen2's q/k/v biases, Qwen3's QK-norm weights, DeepSeek-V3's multi-token-prediction
module, gpt-oss's attention sinks and router biases, dropout rates) is written into the description's
``notes``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits as lim
from advisor.specs.untrusted import prefix

HF_CONFIG_NAME = "config.json"

# model_type -> the causal-LM classes of transformers whose weights the description counts
ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "deepseek_v3": ("DeepseekV3ForCausalLM",),
    "gpt_oss": ("GptOssForCausalLM",),
    "gpt2": ("GPT2LMHeadModel",),
    "gpt_neox": ("GPTNeoXForCausalLM",),
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
_TYPE_OF_ARCHITECTURE = {cls: t for t, classes in ARCHITECTURES.items() for cls in classes}

_DROPOUT = "a dropout rate: whether dropout runs is the job's --dropout setting, not the model's"
_ROPE = "RoPE frequencies and their scaling (YaRN, Llama 3, NTK...) change no shape and no matmul"
_EPS = "a normalization epsilon"
_TOKEN = "a special token id"

# Keys any family accepts: they change neither a weight shape nor the work of a training step.
PRICE_NEUTRAL: dict[str, str] = {
    "_name_or_path": "where the file came from (it gives the description's name when it is a safe name)",
    "architectures": "checked against model_type",
    "model_type": "picks the reader",
    "transformers_version": "the library version that wrote the file",
    "torch_dtype": "the dtype of the released weights: training is priced in the job's --dtype",
    "dtype": "the dtype of the released weights: training is priced in the job's --dtype",
    "quantization_config": "how the released weights are stored (FP8, MXFP4...): training is priced in the job's --dtype",
    "use_cache": "the inference KV cache",
    "auto_map": "where remote code lives",
    "initializer_range": "weight initialization",
    "initializer_factor": "weight initialization",
    "rms_norm_eps": _EPS,
    "layer_norm_eps": _EPS,
    "layer_norm_epsilon": _EPS,
    "rope_theta": _ROPE,
    "rope_scaling": _ROPE,
    "rope_parameters": _ROPE,
    "rope_interleave": _ROPE,
    "partial_rotary_factor": "rotary embeddings on part of a head: elementwise, no weights",
    "attention_dropout": _DROPOUT,
    "hidden_dropout": _DROPOUT,
    "resid_pdrop": _DROPOUT,
    "embd_pdrop": _DROPOUT,
    "attn_pdrop": _DROPOUT,
    "classifier_dropout": _DROPOUT,
    "summary_first_dropout": _DROPOUT,
    "bos_token_id": _TOKEN,
    "eos_token_id": _TOKEN,
    "pad_token_id": _TOKEN,
    "sep_token_id": _TOKEN,
    "decoder_start_token_id": _TOKEN,
    "forced_bos_token_id": _TOKEN,
    "forced_eos_token_id": _TOKEN,
    "tokenizer_class": "the tokenizer",
    "id2label": "labels of a classification head the causal LM does not have",
    "label2id": "labels of a classification head the causal LM does not have",
    "num_labels": "labels of a classification head the causal LM does not have",
    "problem_type": "a classification head the causal LM does not have",
    "finetuning_task": "a classification head the causal LM does not have",
    "task_specific_params": "generation defaults",
    "prefix": "generation defaults",
    "max_length": "generation defaults",
    "min_length": "generation defaults",
    "do_sample": "generation defaults",
    "early_stopping": "generation defaults",
    "num_beams": "generation defaults",
    "num_beam_groups": "generation defaults",
    "diversity_penalty": "generation defaults",
    "temperature": "generation defaults",
    "top_k": "generation defaults",
    "top_p": "generation defaults",
    "typical_p": "generation defaults",
    "repetition_penalty": "generation defaults",
    "length_penalty": "generation defaults",
    "no_repeat_ngram_size": "generation defaults",
    "encoder_no_repeat_ngram_size": "generation defaults",
    "bad_words_ids": "generation defaults",
    "num_return_sequences": "generation defaults",
    "output_scores": "generation defaults",
    "return_dict_in_generate": "generation defaults",
    "remove_invalid_values": "generation defaults",
    "exponential_decay_length_penalty": "generation defaults",
    "suppress_tokens": "generation defaults",
    "begin_suppress_tokens": "generation defaults",
    "output_attentions": "what the forward returns",
    "output_hidden_states": "what the forward returns",
    "return_dict": "what the forward returns",
    "use_return_dict": "what the forward returns",
    "torchscript": "export switch",
    "use_bfloat16": "a TensorFlow-era dtype switch: training is priced in the job's --dtype",
    "tf_legacy_loss": "a TensorFlow loss switch",
    "chunk_size_feed_forward": "runs the same feed-forward work in chunks",
    "is_decoder": "every supported model is a decoder",
    "tie_encoder_decoder": "no encoder-decoder model is supported",
    "cross_attention_hidden_size": "only used with add_cross_attention, which must be false",
}

_MOE_NEUTRAL = {
    "output_router_logits": "returns the router logits",
    "router_aux_loss_coef": "the weight of the load-balancing loss",
    "router_z_loss_coef": "the weight of the router z-loss",
    "router_jitter_noise": "noise on the router input",
    "norm_topk_prob": "renormalizes the top-k gate values",
}

# Family-specific keys accepted as price-neutral.
FAMILY_NEUTRAL: dict[str, dict[str, str]] = {
    "llama": {"pretraining_tp": "emulates Meta's tensor-parallel numerics; same weights and work"},
    "mistral": {},
    "mixtral": dict(_MOE_NEUTRAL),
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": dict(_MOE_NEUTRAL),
    "deepseek_v3": {
        **_MOE_NEUTRAL,
        "pretraining_tp": "emulates tensor-parallel numerics; same weights and work",
        "n_group": "grouped routing (device-limited): which experts, not how many",
        "topk_group": "grouped routing (device-limited): which experts, not how many",
        "topk_method": "how the top-k experts are chosen (noaux_tc adds one bias per expert)",
        "scoring_func": "sigmoid or softmax gate scores",
        "routed_scaling_factor": "a scale on the routed experts' output",
        "aux_loss_alpha": "the weight of the load-balancing loss",
        "seq_aux": "sequence-wise balancing loss",
        "ep_size": "the reference code's expert-parallel size, not the model's",
    },
    "gpt_oss": {
        **_MOE_NEUTRAL,
        "swiglu_limit": "the clamp of gpt-oss's SwiGLU variant (elementwise)",
        "swiglu_alpha": "the sigmoid gain of gpt-oss's SwiGLU variant (elementwise)",
        "initial_context_length": "the context before YaRN extension (RoPE)",
        "rope_scaling_factor": _ROPE,
        "rope_ntk_alpha": _ROPE,
        "rope_ntk_beta": _ROPE,
    },
    "gpt2": {
        "n_ctx": "legacy copy of n_positions, unused by transformers",
        "scale_attn_weights": "a scale on the attention scores",
        "scale_attn_by_inverse_layer_idx": "a scale on the attention scores",
        "reorder_and_upcast_attn": "upcasts the score matmul (numerics)",
        "summary_type": "the sequence-summary head of GPT2DoubleHeadsModel, not in the LM",
        "summary_use_proj": "the sequence-summary head of GPT2DoubleHeadsModel, not in the LM",
        "summary_activation": "the sequence-summary head of GPT2DoubleHeadsModel, not in the LM",
        "summary_proj_to_labels": "the sequence-summary head of GPT2DoubleHeadsModel, not in the LM",
    },
    "gpt_neox": {
        "rotary_pct": "rotary embeddings on part of a head: elementwise, no weights",
        "rotary_emb_base": _ROPE,
        "use_parallel_residual": "attention and MLP read the same input: same matmuls",
    },
}

# Keys accepted only at the value that leaves the model as the reader describes it.
_MUST_BE: dict[str, Any] = {
    "is_encoder_decoder": False,
    "add_cross_attention": False,
    "pruned_heads": {},
}

# Keys each family reads (besides PRICE_NEUTRAL and FAMILY_NEUTRAL).
_LLAMA_SHAPE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "hidden_act", "vocab_size", "max_position_embeddings", "tie_word_embeddings")
_QWEN_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
READ: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_SHAPE + ("head_dim", "attention_bias", "mlp_bias"),
    "mistral": _LLAMA_SHAPE + ("head_dim", "sliding_window", "layer_types"),
    "mixtral": _LLAMA_SHAPE + ("head_dim", "sliding_window", "layer_types", "num_local_experts",
                               "num_experts_per_tok"),
    "qwen2": _LLAMA_SHAPE + _QWEN_WINDOW,
    "qwen3": _LLAMA_SHAPE + ("head_dim", "attention_bias") + _QWEN_WINDOW,
    "qwen3_moe": _LLAMA_SHAPE + ("head_dim", "attention_bias") + _QWEN_WINDOW + (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers"),
    "deepseek_v3": _LLAMA_SHAPE + ("attention_bias", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                   "qk_rope_head_dim", "v_head_dim", "head_dim", "qk_head_dim", "n_routed_experts",
                                   "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                                   "first_k_dense_replace", "moe_layer_freq", "num_nextn_predict_layers"),
    "gpt_oss": _LLAMA_SHAPE + ("head_dim", "sliding_window", "layer_types", "attention_bias", "num_local_experts",
                               "num_experts", "experts_per_token", "num_experts_per_tok"),
    "gpt2": ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "activation_function",
             "tie_word_embeddings"),
    "gpt_neox": ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                 "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias"),
}

# transformers' default of tie_word_embeddings per family (PretrainedConfig's True for GPT-2)
_TIED_BY_DEFAULT = {"gpt2": True}
_GATED_ACTS = ("silu", "swish")
_GELU_ACTS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate", "quick_gelu")
_CONTROL = re.compile("[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def is_hf_config(data: Any) -> bool:
    """A Hugging Face config: a mapping with "architectures" or "model_type" (advisor's own model
    files have neither key)."""
    return isinstance(data, dict) and ("architectures" in data or "model_type" in data)


def default_name(data: dict[str, Any], path: Path | str) -> str:
    """The config's ``_name_or_path`` when it is a safe name (e.g. "meta-llama/Meta-Llama-3-8B"),
    else the name of the folder that holds the file, reduced to the characters a name may hold."""
    given = data.get("_name_or_path")
    if isinstance(given, str) and len(given) <= lim.MAX_NAME_CHARS and f.NAME_PATTERN.fullmatch(given):
        return given
    folder = Path(path).resolve().parent.name
    safe = re.sub(r"[^A-Za-z0-9 ._+\-/()\[\]:@]", "-", folder).lstrip(" ._+-/()[]:@")[:lim.MAX_NAME_CHARS]
    return safe or "hf-model"


def model_from_hf_config(data: dict[str, Any], origin: str, name: str) -> dict[str, Any]:
    """The advisor model description (the mapping a models/*.yaml file holds) of a Hugging Face
    config.json; ``origin`` is the file (named in every error), ``name`` the description's name."""
    if not isinstance(data, dict):
        raise AdvisorError(f"{origin}: the top level must be a mapping of keys to values, not {type(data).__name__}")
    model_type = _model_type(data, origin)
    _check_keys(data, origin, model_type)
    notes: list[str] = []
    out = _READERS[model_type](data, origin, notes)
    if model_type not in ("gpt2",):
        max_pos = _int(data, "max_position_embeddings", origin, maximum=None)
        out["seq_length"] = _seq_length(max_pos, "max_position_embeddings", notes)
    _general_notes(data, notes)
    safe_origin = _CONTROL.sub("?", origin)
    ordered = {"name": name, "source": f"Hugging Face config.json of {name} ({safe_origin})"}
    ordered.update(out)
    ordered["notes"] = " ".join([f"Imported by advisor/specs/hf_config.py from {safe_origin} (model_type "
                                 f"{model_type})."] + notes)[:lim.MAX_TEXT_CHARS]
    return ordered


# ---- checks -----------------------------------------------------------------------------------


def _model_type(data: dict[str, Any], origin: str) -> str:
    archs = data.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs)):
        raise AdvisorError(f"{origin}: key 'architectures' = {prefix(archs)} must be a list of class names")
    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise AdvisorError(f"{origin}: key 'model_type' = {prefix(model_type)} must be the name of a model type "
                           f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if model_type is None:
        known = [_TYPE_OF_ARCHITECTURE.get(a) for a in archs or ()]
        if not known or None in known or len(set(known)) != 1:
            bad = next((a for a in archs or () if a not in _TYPE_OF_ARCHITECTURE), archs)
            raise AdvisorError(f"{origin}: key 'architectures' = {prefix(bad)} is not a model advisor reads from a "
                               f"config.json (give model_type; supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        return known[0]
    if model_type not in ARCHITECTURES:
        raise AdvisorError(f"{origin}: key 'model_type' = {prefix(model_type)} is not a model type advisor reads "
                           f"from a config.json (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for a in archs or ():
        if a not in ARCHITECTURES[model_type]:
            raise AdvisorError(f"{origin}: key 'architectures' = {prefix(a)} is not the causal LM of model_type "
                               f"{model_type!r} ({', '.join(ARCHITECTURES[model_type])}), whose weights advisor counts")
    return model_type


def _check_keys(data: dict[str, Any], origin: str, model_type: str) -> None:
    known = set(PRICE_NEUTRAL) | set(FAMILY_NEUTRAL[model_type]) | set(READ[model_type])
    for key, value in data.items():
        if key in _MUST_BE:
            if value is not None and value != _MUST_BE[key]:
                raise AdvisorError(f"{origin}: key '{key}' = {prefix(value)} changes the model that advisor prices "
                                   f"for model_type {model_type!r} and cannot be expressed (only {_MUST_BE[key]!r})")
        elif key not in known:
            raise AdvisorError(f"{origin}: key {prefix(key)} = {prefix(value)} is not one advisor knows for model_type "
                               f"{model_type!r}, so it cannot tell whether it changes the price (the keys read and "
                               f"those accepted as price-neutral are listed in advisor/specs/hf_config.py)")


def _int(data: dict[str, Any], key: str, origin: str, minimum: int = 1, maximum: int | None = None,
         default: Any = ...) -> int:
    """An integer key of the config, named in the error as the config spells it."""
    if data.get(key) is None:
        if default is ...:
            raise AdvisorError(f"{origin}: missing key '{key}', which advisor needs to price this model")
        return default
    if minimum == 0:
        return f.non_negative_int(data, key, origin, maximum=maximum)
    return f.positive_int(data, key, origin, maximum=maximum)


def _bool(data: dict[str, Any], key: str, origin: str, default: bool) -> bool:
    if data.get(key) is None:
        return default
    return f.boolean(data, key, origin)


def _refuse(origin: str, key: str, value: Any, why: str) -> AdvisorError:
    return AdvisorError(f"{origin}: key '{key}' = {prefix(value)} {why}")


def _seq_length(value: int, key: str, notes: list[str]) -> int:
    if value > lim.MAX_SEQ_LENGTH:
        notes.append(f"seq_length is capped at advisor's bound {lim.MAX_SEQ_LENGTH:,} (advisor/specs/limits.py); "
                     f"the config's {key} is {value:,}.")
        return lim.MAX_SEQ_LENGTH
    notes.append(f"seq_length is the config's {key} ({value:,}), the longest context the model was built for; "
                 f"--seq-len prices a training length.")
    return value


def _general_notes(data: dict[str, Any], notes: list[str]) -> None:
    rates = [f"{k} {data[k]}" for k, why in PRICE_NEUTRAL.items() if why == _DROPOUT
             and isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool) and data[k] > 0]
    if rates:
        notes.append(f"The config's dropout rates ({', '.join(rates)}) are not part of the description: --dropout "
                     f"prices dropout.")
    quant = data.get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        notes.append(f"The released weights are stored as {quant['quant_method'][:40]} (quantization_config); "
                     f"training is priced in the job's --dtype.")


# ---- pieces shared by the families -------------------------------------------------------------


def _common(data: dict[str, Any], origin: str, model_type: str) -> dict[str, Any]:
    """Layers, widths, heads, vocabulary and tied embeddings of the Llama-like families."""
    heads = _int(data, "num_attention_heads", origin, maximum=lim.MAX_HEADS)
    return {
        "num_layers": _int(data, "num_hidden_layers", origin, maximum=lim.MAX_LAYERS),
        "hidden_size": _int(data, "hidden_size", origin, maximum=lim.MAX_HIDDEN),
        "num_attention_heads": heads,
        "num_kv_heads": _int(data, "num_key_value_heads", origin, maximum=lim.MAX_HEADS, default=heads),
        "ffn_hidden_size": _int(data, "intermediate_size", origin, maximum=lim.MAX_FFN_HIDDEN),
        "vocab_size": _int(data, "vocab_size", origin, maximum=lim.MAX_VOCAB),
        "tie_embeddings": _bool(data, "tie_word_embeddings", origin, _TIED_BY_DEFAULT.get(model_type, False)),
    }


def _llama_like(data: dict[str, Any], origin: str, model_type: str, notes: list[str]) -> dict[str, Any]:
    out = _common(data, origin, model_type)
    out["ffn_activation"] = _gated_activation(data, origin, notes)
    out["norm"] = "rmsnorm"
    out["position_embedding"] = "rotary"
    head_dim = _int(data, "head_dim", origin, maximum=lim.MAX_HIDDEN, default=None)
    if head_dim is not None and (out["hidden_size"] % out["num_attention_heads"]
                                 or head_dim != out["hidden_size"] // out["num_attention_heads"]):
        out["head_dim"] = head_dim
    return out


def _gated_activation(data: dict[str, Any], origin: str, notes: list[str]) -> str:
    act = data.get("hidden_act", "silu")
    if not isinstance(act, str):
        raise _refuse(origin, "hidden_act", act, "must be the name of an activation function")
    if act not in _GATED_ACTS:
        notes.append(f"The gated MLP uses {act[:40]} (hidden_act); it is priced as swiglu, the same three matrices.")
    return "swiglu"


def _plain_activation(data: dict[str, Any], key: str, origin: str, default: str, notes: list[str]) -> str:
    act = data.get(key, default)
    if not isinstance(act, str):
        raise _refuse(origin, key, act, "must be the name of an activation function")
    if act not in _GELU_ACTS:
        notes.append(f"The MLP uses {act[:40]} ({key}); it is priced as gelu, the same two matrices.")
    return "gelu"


def _biases(data: dict[str, Any], origin: str, notes: list[str], attention_default: bool = False,
            mlp_default: bool = False) -> bool:
    """advisor's use_bias puts a bias on every linear layer; a config with biases on some of them gets
    use_bias when it has any (the extra ones are a few parameters per layer) and says so."""
    attention = _bool(data, "attention_bias", origin, attention_default)
    mlp = _bool(data, "mlp_bias", origin, mlp_default)
    if attention != mlp:
        where = "attention" if attention else "MLP"
        notes.append(f"Biases only on the {where} linears (attention_bias {attention}, mlp_bias {mlp}); advisor's "
                     f"use_bias counts them on every linear layer.")
    return attention or mlp


def _window_pattern(sliding: list[int], num_layers: int, origin: str, key: str, value: Any) -> int | None:
    """sliding_window_every for a set of windowed layers (None: none windowed); refused unless the
    windowed layers are every k-th layer (advisor prices the share 1/k of windowed layers)."""
    if not sliding:
        return None
    n = len(sliding)
    if num_layers % n == 0:
        k = num_layers // n
        r = sliding[0]
        if r < k and sliding == list(range(r, num_layers, k)):
            return k
    raise _refuse(origin, key, value, f"windows layers {prefix(sliding)} of {num_layers}; advisor expresses a "
                                      f"sliding window on every layer or on every k-th layer only")


def _layer_types(data: dict[str, Any], origin: str, num_layers: int) -> list[int] | None:
    """Indices of the windowed layers given by ``layer_types`` (None: no such key)."""
    types = data.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise _refuse(origin, "layer_types", types, f"must list one attention type for each of the {num_layers} layers")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise _refuse(origin, "layer_types", t, "is an attention type advisor cannot price (it knows "
                                                     "'full_attention' and 'sliding_attention')")
    return [i for i, t in enumerate(types) if t == "sliding_attention"]


def _apply_window(out: dict[str, Any], data: dict[str, Any], origin: str, sliding: list[int] | None,
                  key: str) -> None:
    if not sliding:
        return
    window = _int(data, "sliding_window", origin, maximum=lim.MAX_SEQ_LENGTH)
    every = _window_pattern(sliding, out["num_layers"], origin, key, data.get(key))
    out["sliding_window"] = window
    out["sliding_window_every"] = every


def _mistral_window(out: dict[str, Any], data: dict[str, Any], origin: str) -> None:
    """Mistral and Mixtral: sliding_window (when not null) windows every layer."""
    sliding = _layer_types(data, origin, out["num_layers"])
    if sliding is None and data.get("sliding_window") is not None:
        sliding = list(range(out["num_layers"]))
    _apply_window(out, data, origin, sliding, "layer_types" if "layer_types" in data else "sliding_window")


def _qwen_window(out: dict[str, Any], data: dict[str, Any], origin: str) -> None:
    """Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on are windowed (transformers'
    Qwen2Config); layer_types, where given, says it directly. Without it the window keys are unused."""
    layers = out["num_layers"]
    sliding = _layer_types(data, origin, layers)
    key = "layer_types"
    if sliding is None:
        if not _bool(data, "use_sliding_window", origin, False) or data.get("sliding_window") is None:
            return
        first = _int(data, "max_window_layers", origin, minimum=0, maximum=lim.MAX_LAYERS, default=layers)
        sliding = list(range(first, layers))
        key = "max_window_layers"
    _apply_window(out, data, origin, sliding, key)


# ---- the families ------------------------------------------------------------------------------


def _read_llama(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "llama", notes)
    out["use_bias"] = _biases(data, origin, notes)
    return out


def _read_mistral(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "mistral", notes)
    out["use_bias"] = False
    _mistral_window(out, data, origin)
    return out


def _read_mixtral(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "mixtral", notes)
    out["use_bias"] = False
    _mistral_window(out, data, origin)
    out["moe"] = {
        "num_experts": _int(data, "num_local_experts", origin, maximum=lim.MAX_EXPERTS),
        "top_k": _int(data, "num_experts_per_tok", origin, maximum=lim.MAX_EXPERTS),
        "expert_ffn_hidden_size": out["ffn_hidden_size"],
        "layer_frequency": 1,
    }
    notes.append("Every layer's MLP is a sparse MoE block whose experts are intermediate_size wide.")
    return out


def _read_qwen2(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "qwen2", notes)
    out["use_bias"] = False
    _qwen_window(out, data, origin)
    kv_width = out["num_kv_heads"] * out["hidden_size"] // out["num_attention_heads"]
    per_layer = out["hidden_size"] + 2 * kv_width
    notes.append(f"Qwen2 has biases on the q, k and v projections only ({per_layer:,} per layer, "
                 f"{per_layer * out['num_layers']:,} in all); they are not counted (use_bias would put biases on "
                 f"every linear layer).")
    return out


def _read_qwen3(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "qwen3", notes)
    out["use_bias"] = _biases(data, origin, notes)
    _qwen_window(out, data, origin)
    _qk_norm_note(out, notes)
    return out


def _qk_norm_note(out: dict[str, Any], notes: list[str]) -> None:
    head_dim = out.get("head_dim") or out["hidden_size"] // out["num_attention_heads"]
    notes.append(f"QK-norm (an RMSNorm of {head_dim} weights on the queries and one on the keys of each layer, "
                 f"{2 * head_dim * out['num_layers']:,} in all) is not counted.")


def _read_qwen3_moe(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "qwen3_moe", notes)
    out["use_bias"] = _biases(data, origin, notes)
    _qwen_window(out, data, origin)
    _qk_norm_note(out, notes)
    layers = out["num_layers"]
    experts = _int(data, "num_experts", origin, minimum=0, maximum=lim.MAX_EXPERTS)
    step = _int(data, "decoder_sparse_step", origin, maximum=lim.MAX_LAYERS, default=1)
    dense = [] if data.get("mlp_only_layers") is None else data["mlp_only_layers"]
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers
                                              for i in dense):
        raise _refuse(origin, "mlp_only_layers", dense, f"must list layer indices below num_hidden_layers = {layers}")
    # transformers' Qwen3MoeDecoderLayer: MoE where the layer is not in mlp_only_layers and (i + 1) % step == 0
    moe_layers = [i for i in range(layers) if i not in set(dense) and experts > 0 and (i + 1) % step == 0]
    if not moe_layers:
        notes.append("No layer is a MoE layer (num_experts, decoder_sparse_step, mlp_only_layers): a dense model.")
        return out
    first = _leading_dense(moe_layers, layers, step)
    if first is None:
        raise _refuse(origin, "mlp_only_layers", dense, "keeps dense MLPs on layers that are not the leading ones; "
                                                        "advisor expresses dense layers only before the first MoE "
                                                        "layer (first_k_dense_layers)")
    out["moe"] = {
        "num_experts": experts,
        "top_k": _int(data, "num_experts_per_tok", origin, maximum=lim.MAX_EXPERTS),
        "expert_ffn_hidden_size": _int(data, "moe_intermediate_size", origin, maximum=lim.MAX_FFN_HIDDEN),
        "layer_frequency": step,
    }
    if first:
        out["moe"]["first_k_dense_layers"] = first
    notes.append("No shared experts (Qwen3-MoE has none); dense layers, if any, use intermediate_size.")
    return out


def _leading_dense(moe_layers: list[int], layers: int, freq: int) -> int | None:
    """first_k_dense_layers k for which advisor's MoE layers (i >= k and (i + 1) % freq == 0) are
    exactly ``moe_layers`` (None: no such k)."""
    for k in (0, moe_layers[0]):    # 0 where the leading layers are dense by the frequency alone
        if [i for i in range(k, layers) if (i + 1) % freq == 0] == moe_layers:
            return k
    return None


def _read_deepseek_v3(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _common(data, origin, "deepseek_v3")
    out["ffn_activation"] = _gated_activation(data, origin, notes)
    out["norm"] = "rmsnorm"
    out["position_embedding"] = "rotary"
    out["use_bias"] = _biases(data, origin, notes)
    mla = {
        "kv_lora_rank": _int(data, "kv_lora_rank", origin, maximum=lim.MAX_HIDDEN),
        "qk_nope_head_dim": _int(data, "qk_nope_head_dim", origin, maximum=lim.MAX_HIDDEN),
        "qk_rope_head_dim": _int(data, "qk_rope_head_dim", origin, maximum=lim.MAX_HIDDEN),
        "v_head_dim": _int(data, "v_head_dim", origin, maximum=lim.MAX_HIDDEN),
        "q_lora_rank": _int(data, "q_lora_rank", origin, minimum=0, maximum=lim.MAX_HIDDEN, default=0),
    }
    out["mla"] = mla
    # newer transformers write the derived widths back: accepted when they agree
    for key, expected in (("head_dim", mla["qk_rope_head_dim"]),
                          ("qk_head_dim", mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"])):
        if data.get(key) is not None and data[key] != expected:
            raise _refuse(origin, key, data[key], f"disagrees with the MLA widths (DeepSeek-V3 derives it as {expected})")
    if out["num_kv_heads"] != out["num_attention_heads"]:
        raise _refuse(origin, "num_key_value_heads", out["num_kv_heads"],
                      f"differs from num_attention_heads = {out['num_attention_heads']}; MLA has one key and value "
                      f"head per query head")
    layers = out["num_layers"]
    experts = _int(data, "n_routed_experts", origin, minimum=0, maximum=lim.MAX_EXPERTS, default=0)
    first = _int(data, "first_k_dense_replace", origin, minimum=0, maximum=lim.MAX_LAYERS, default=0)
    freq = _int(data, "moe_layer_freq", origin, maximum=lim.MAX_LAYERS, default=1)
    if experts and first < layers:
        if freq != 1:
            # DeepSeek's modeling code: MoE where i >= first_k_dense_replace and i % moe_layer_freq == 0
            raise _refuse(origin, "moe_layer_freq", freq, "puts MoE layers where i % moe_layer_freq == 0, which "
                                                          "advisor's layer_frequency ((i + 1) % frequency == 0) "
                                                          "cannot express; only 1 is read")
        moe: dict[str, Any] = {
            "num_experts": experts,
            "top_k": _int(data, "num_experts_per_tok", origin, maximum=lim.MAX_EXPERTS),
            "expert_ffn_hidden_size": _int(data, "moe_intermediate_size", origin, maximum=lim.MAX_FFN_HIDDEN),
            "layer_frequency": 1,
        }
        if first:
            moe["first_k_dense_layers"] = first
        shared = _int(data, "n_shared_experts", origin, minimum=0, maximum=lim.MAX_EXPERTS, default=0)
        if shared:
            moe["num_shared_experts"] = shared
            moe["shared_expert_ffn_hidden_size"] = moe["expert_ffn_hidden_size"]
        out["moe"] = moe
        notes.append(f"Layers 0-{first - 1} keep a dense MLP of intermediate_size; the others are MoE layers."
                     if first else "Every layer is a MoE layer.")
    else:
        notes.append("No MoE layer (n_routed_experts, first_k_dense_replace): a dense model.")
    mtp = _int(data, "num_nextn_predict_layers", origin, minimum=0, maximum=lim.MAX_LAYERS, default=0)
    if mtp:
        notes.append(f"The {mtp} multi-token-prediction module(s) of the checkpoint (num_nextn_predict_layers) are not "
                     f"counted or priced: transformers' DeepseekV3ForCausalLM does not build them, and DeepSeek's "
                     f"published total (671B for V3) leaves them out.")
    return out


def _read_gpt_oss(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    out = _llama_like(data, origin, "gpt_oss", notes)
    attention_bias = _bool(data, "attention_bias", origin, True)
    out["use_bias"] = True
    if not attention_bias:
        notes.append("attention_bias is false but the experts carry biases; advisor's use_bias counts biases on "
                     "every linear layer.")
    if "num_local_experts" in data and "num_experts" in data and data["num_local_experts"] != data["num_experts"]:
        raise _refuse(origin, "num_experts", data["num_experts"],
                      f"disagrees with 'num_local_experts' = {prefix(data['num_local_experts'])}")
    experts = _int(data, "num_local_experts" if "num_local_experts" in data else "num_experts", origin,
                   maximum=lim.MAX_EXPERTS)
    top_keys = [k for k in ("experts_per_token", "num_experts_per_tok") if data.get(k) is not None]
    if not top_keys:
        raise AdvisorError(f"{origin}: missing key 'num_experts_per_tok' (or 'experts_per_token'), which advisor "
                           f"needs to price model_type 'gpt_oss'")
    top = [_int(data, k, origin, maximum=lim.MAX_EXPERTS) for k in top_keys]
    if len(set(top)) > 1:
        raise _refuse(origin, "experts_per_token", top[0], f"disagrees with 'num_experts_per_tok' = {top[1]}")
    out["moe"] = {"num_experts": experts, "top_k": top[0], "expert_ffn_hidden_size": out["ffn_hidden_size"],
                  "layer_frequency": 1}
    layers = out["num_layers"]
    sliding = _layer_types(data, origin, layers)
    key = "layer_types"
    if sliding is None and data.get("sliding_window") is not None:
        # GptOssConfig's default layer_types: sliding on even layers, full attention on odd ones
        sliding = [i for i in range(layers) if (i + 1) % 2]
        key = "sliding_window"
    _apply_window(out, data, origin, sliding, key)
    notes.append("Every layer's MLP is a MoE block of clamped-SwiGLU experts with biases. The learned attention sinks "
                 f"({out['num_attention_heads']} per layer) and the router's biases ({experts} per layer) are not "
                 "counted.")
    return out


def _read_gpt2(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    hidden = _int(data, "n_embd", origin, maximum=lim.MAX_HIDDEN)
    positions = _int(data, "n_positions", origin, maximum=None)
    out = {
        "num_layers": _int(data, "n_layer", origin, maximum=lim.MAX_LAYERS),
        "hidden_size": hidden,
        "num_attention_heads": _int(data, "n_head", origin, maximum=lim.MAX_HEADS),
        "ffn_hidden_size": _int(data, "n_inner", origin, maximum=lim.MAX_FFN_HIDDEN, default=4 * hidden),
        "ffn_activation": _plain_activation(data, "activation_function", origin, "gelu_new", notes),
        "vocab_size": _int(data, "vocab_size", origin, maximum=lim.MAX_VOCAB),
        "seq_length": _seq_length(positions, "n_positions", notes),
        "tie_embeddings": _bool(data, "tie_word_embeddings", origin, True),
        "norm": "layernorm",
        "use_bias": True,
        "position_embedding": "learned",
    }
    return out


def _read_gpt_neox(data: dict[str, Any], origin: str, notes: list[str]) -> dict[str, Any]:
    heads = _int(data, "num_attention_heads", origin, maximum=lim.MAX_HEADS)
    out = {
        "num_layers": _int(data, "num_hidden_layers", origin, maximum=lim.MAX_LAYERS),
        "hidden_size": _int(data, "hidden_size", origin, maximum=lim.MAX_HIDDEN),
        "num_attention_heads": heads,
        "ffn_hidden_size": _int(data, "intermediate_size", origin, maximum=lim.MAX_FFN_HIDDEN),
        "ffn_activation": _plain_activation(data, "hidden_act", origin, "gelu", notes),
        "vocab_size": _int(data, "vocab_size", origin, maximum=lim.MAX_VOCAB),
        "tie_embeddings": _bool(data, "tie_word_embeddings", origin, False),
        "norm": "layernorm",
        "position_embedding": "rotary",
    }
    attention_bias = _bool(data, "attention_bias", origin, True)
    out["use_bias"] = True
    if not attention_bias:
        notes.append("attention_bias is false but the MLP carries biases; advisor's use_bias counts biases on every "
                     "linear layer.")
    return out


_READERS = {
    "llama": _read_llama,
    "mistral": _read_mistral,
    "mixtral": _read_mixtral,
    "qwen2": _read_qwen2,
    "qwen3": _read_qwen3,
    "qwen3_moe": _read_qwen3_moe,
    "deepseek_v3": _read_deepseek_v3,
    "gpt_oss": _read_gpt_oss,
    "gpt2": _read_gpt2,
    "gpt_neox": _read_gpt_neox,
}
