"""Sub-blocks of a model description: the MoE block, multi-head latent attention, weight matrices.

Loaded from the ``moe:`` and ``mla:`` mappings of a model file (see advisor.specs.model).
Sources: Megatron-Core's MoE options (moe_layer_freq, shared experts: moe_shared_expert_intermediate_size);
DeepSeek-V2 (arXiv 2405.04434) section 2.1 and DeepSeek-V3's config (first_k_dense_replace,
n_shared_experts, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits as lim

_MOE_REQUIRED = ("num_experts", "top_k", "expert_ffn_hidden_size")
_MOE_OPTIONAL = ("layer_frequency", "first_k_dense_layers", "num_shared_experts", "shared_expert_ffn_hidden_size")
_MLA_REQUIRED = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_MLA_OPTIONAL = ("q_lora_rank",)


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    layer_frequency: int = 1
    first_k_dense_layers: int = 0          # DeepSeek's first_k_dense_replace: leading layers stay dense
    num_shared_experts: int = 0            # experts every token passes through (DeepSeek, Qwen2-MoE)
    shared_expert_ffn_hidden_size: int | None = None   # default: expert_ffn_hidden_size

    @property
    def shared_ffn(self) -> int:
        """Width of the shared experts together (0 without them)."""
        per = self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size
        return self.num_shared_experts * per


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V2 paper, section 2.1)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0                   # 0: queries projected directly (DeepSeek-V2-Lite)


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a layer: in x out features; ``tp`` is how tensor parallelism splits it
    (column: the output, row: the input, None: replicated, as MLA's down-projections)."""

    fan_in: int
    fan_out: int
    tp: str | None


def moe_from_dict(raw: Any, origin: str, num_layers: int) -> MoESpec:
    mo = f"{origin}: moe"
    f.check_keys(raw, mo, _MOE_REQUIRED, _MOE_OPTIONAL)
    shared_ffn = raw.get("shared_expert_ffn_hidden_size")
    moe = MoESpec(
        num_experts=f.positive_int(raw, "num_experts", mo, maximum=lim.MAX_EXPERTS),
        top_k=f.positive_int(raw, "top_k", mo, maximum=lim.MAX_EXPERTS),
        expert_ffn_hidden_size=f.positive_int(raw, "expert_ffn_hidden_size", mo, maximum=lim.MAX_FFN_HIDDEN),
        layer_frequency=f.positive_int(raw, "layer_frequency", mo, default=1, maximum=lim.MAX_LAYERS),
        first_k_dense_layers=f.non_negative_int(raw, "first_k_dense_layers", mo, default=0, maximum=lim.MAX_LAYERS),
        num_shared_experts=f.non_negative_int(raw, "num_shared_experts", mo, default=0, maximum=lim.MAX_EXPERTS),
        shared_expert_ffn_hidden_size=None if shared_ffn is None else f.positive_int(raw, "shared_expert_ffn_hidden_size", mo,
                                                                                      maximum=lim.MAX_FFN_HIDDEN),
    )
    if moe.top_k > moe.num_experts:
        raise AdvisorError(f"{mo}: key 'top_k' = {moe.top_k} exceeds num_experts = {moe.num_experts}")
    if moe.layer_frequency > num_layers:
        raise AdvisorError(f"{mo}: key 'layer_frequency' = {moe.layer_frequency} exceeds num_layers = {num_layers}")
    # MoE layers: index j >= first_k_dense_layers with (j + 1) % layer_frequency == 0
    if num_layers // moe.layer_frequency - moe.first_k_dense_layers // moe.layer_frequency <= 0:
        raise AdvisorError(f"{mo}: key 'first_k_dense_layers' = {moe.first_k_dense_layers} leaves no MoE layer "
                           f"of num_layers = {num_layers} at layer_frequency = {moe.layer_frequency}")
    if moe.shared_expert_ffn_hidden_size is not None and not moe.num_shared_experts:
        raise AdvisorError(f"{mo}: key 'shared_expert_ffn_hidden_size' = {moe.shared_expert_ffn_hidden_size} "
                           f"needs num_shared_experts > 0")
    return moe


def mla_from_dict(raw: Any, origin: str) -> MLASpec:
    mo = f"{origin}: mla"
    f.check_keys(raw, mo, _MLA_REQUIRED, _MLA_OPTIONAL)
    return MLASpec(
        kv_lora_rank=f.positive_int(raw, "kv_lora_rank", mo, maximum=lim.MAX_HIDDEN),
        qk_nope_head_dim=f.positive_int(raw, "qk_nope_head_dim", mo, maximum=lim.MAX_HIDDEN),
        qk_rope_head_dim=f.positive_int(raw, "qk_rope_head_dim", mo, maximum=lim.MAX_HIDDEN),
        v_head_dim=f.positive_int(raw, "v_head_dim", mo, maximum=lim.MAX_HIDDEN),
        q_lora_rank=f.non_negative_int(raw, "q_lora_rank", mo, default=0, maximum=lim.MAX_HIDDEN),
    )
