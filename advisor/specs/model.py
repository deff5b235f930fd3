"""Model descriptions (models/NAME.yaml): loading, validation and derived figures.

Parameter counts follow the layer layout of Megatron-LM's GPT and Llama implementations:
attention (Q, K, V, output projections; GQA shrinks K and V), the MLP (two matrices for GELU, three
for SwiGLU), norms, token embeddings, optional learned position embeddings, and an untied LM head.
FLOP counts follow Narayanan et al. SC'21 (Megatron-LM), appendix: a matmul of an (m x k) by a
(k x n) matrix costs 2mkn FLOPs; backward costs twice the forward; attention's score and context
batched matmuls add 2 * 2 * s * h FLOPs per token and layer in the forward (the full s x s product is
counted, as Megatron does, not only the causal half).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

_REQUIRED = ("name", "source", "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
_OPTIONAL = (
    "num_kv_heads", "ffn_hidden_size", "ffn_activation", "tie_embeddings", "norm", "moe",
    "use_bias", "position_embedding", "published_params", "notes",
)
_MOE_REQUIRED = ("num_experts", "top_k", "expert_ffn_hidden_size")
_MOE_OPTIONAL = ("layer_frequency",)


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    layer_frequency: int = 1


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    ffn_activation: str          # gelu | swiglu
    vocab_size: int
    seq_length: int
    tie_embeddings: bool = False
    norm: str = "layernorm"      # layernorm | rmsnorm
    moe: MoESpec | None = None
    use_bias: bool = False       # linear layers carry biases (GPT-2/3, BERT, Megatron GPT)
    position_embedding: str = "rotary"   # learned | rotary | none
    published_params: float | None = None  # as published, for the 1% check
    notes: str | None = None

    # ---- shapes -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_hidden_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for gated SwiGLU (gate, up, down), 2 for GELU."""
        return 3 if self.ffn_activation == "swiglu" else 2

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        return self.num_layers // self.moe.layer_frequency

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_moe_layer(self, index: int) -> bool:
        """Megatron's moe_layer_freq convention: layer i (0-based) is MoE when (i + 1) % freq == 0."""
        return self.moe is not None and (index + 1) % self.moe.layer_frequency == 0

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    @property
    def attention_params(self) -> int:
        h, kv = self.hidden_size, self.kv_hidden_size
        weights = 2 * h * h + 2 * h * kv
        biases = (2 * h + 2 * kv) if self.use_bias else 0
        return weights + biases

    @property
    def mlp_params(self) -> int:
        h, ff = self.hidden_size, self.ffn_hidden_size
        biases = ((self.ffn_matrices - 1) * ff + h) if self.use_bias else 0
        return self.ffn_matrices * h * ff + biases

    @property
    def expert_params(self) -> int:
        """One expert's MLP."""
        assert self.moe is not None
        h, ff = self.hidden_size, self.moe.expert_ffn_hidden_size
        biases = ((self.ffn_matrices - 1) * ff + h) if self.use_bias else 0
        return self.ffn_matrices * h * ff + biases

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.moe.num_experts if self.moe else 0

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """All experts of one MoE layer plus its attention, norms and router."""
        if self.moe is None:
            return 0
        return self.attention_params + 2 * self.norm_params + self.router_params + self.moe.num_experts * self.expert_params

    @property
    def embedding_params(self) -> int:
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        return self.vocab_size * self.hidden_size + pos

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters, every expert counted."""
        return (
            self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * self.moe_layer_params
            + self.embedding_params
            + self.lm_head_params
            + self.norm_params  # final norm
        )

    @property
    def num_active_params(self) -> int:
        """Parameters a token passes through (top-k experts of each MoE layer)."""
        if self.moe is None:
            return self.num_params
        inactive = (self.moe.num_experts - self.moe.top_k) * self.expert_params
        return self.num_params - self.num_moe_layers * inactive

    # ---- parameter tensors (optimizer launch counts) --------------------------------------------
    def parameter_tensors_per_layer(self, fused_qkv: bool) -> int:
        """Weight and bias tensors of one layer: Megatron fuses Q, K and V into one matrix; PyTorch
        models (torchtitan, advisor's executor) keep four attention projections."""
        bias = 2 if self.use_bias else 1
        norm = 2 if self.norm == "layernorm" else 1
        attention = (2 if fused_qkv else 4) * bias
        mlp = (self.ffn_matrices if self.moe is None else self.moe.num_experts * self.ffn_matrices + 1) * bias
        return 2 * norm + attention + mlp

    # ---- FLOPs --------------------------------------------------------------------------------
    def matmul_params_per_token(self) -> int:
        """Weights a token multiplies through (active experts, LM head; not the embedding lookup)."""
        h = self.hidden_size
        attn = 2 * h * h + 2 * h * self.kv_hidden_size
        dense = attn + self.ffn_matrices * h * self.ffn_hidden_size
        moe = 0
        if self.moe is not None:
            moe = attn + self.moe.top_k * self.ffn_matrices * h * self.moe.expert_ffn_hidden_size + h * self.moe.num_experts
        return self.num_dense_layers * dense + self.num_moe_layers * moe + self.vocab_size * h

    def forward_flops_per_token(self, seq_length: int | None = None) -> float:
        """Forward FLOPs per token: 2 per weight multiply-add plus attention's 4*s*h per layer (SC'21)."""
        s = seq_length or self.seq_length
        attention = 4.0 * s * self.hidden_size * self.num_layers
        return 2.0 * self.matmul_params_per_token() + attention

    def training_flops_per_token(self, seq_length: int | None = None) -> float:
        """Forward plus backward (backward = 2 x forward, SC'21 appendix): the MFU numerator."""
        return 3.0 * self.forward_flops_per_token(seq_length)


def model_from_dict(data: dict[str, Any], origin: str) -> ModelSpec:
    f.check_keys(data, origin, _REQUIRED, _OPTIONAL)
    name = f.text(data, "name", origin)
    source = f.text(data, "source", origin)
    num_layers = f.positive_int(data, "num_layers", origin)
    hidden = f.positive_int(data, "hidden_size", origin)
    heads = f.positive_int(data, "num_attention_heads", origin)
    kv_heads = f.positive_int(data, "num_kv_heads", origin, default=heads)
    if hidden % heads:
        raise AdvisorError(f"{origin}: key 'num_attention_heads' = {heads} does not divide hidden_size = {hidden}")
    if heads % kv_heads:
        raise AdvisorError(f"{origin}: key 'num_kv_heads' = {kv_heads} does not divide num_attention_heads = {heads}")
    moe = None
    if data.get("moe") is not None:
        mo = f"{origin}: moe"
        raw = data["moe"]
        f.check_keys(raw, mo, _MOE_REQUIRED, _MOE_OPTIONAL)
        moe = MoESpec(
            num_experts=f.positive_int(raw, "num_experts", mo),
            top_k=f.positive_int(raw, "top_k", mo),
            expert_ffn_hidden_size=f.positive_int(raw, "expert_ffn_hidden_size", mo),
            layer_frequency=f.positive_int(raw, "layer_frequency", mo, default=1),
        )
        if moe.top_k > moe.num_experts:
            raise AdvisorError(f"{mo}: key 'top_k' = {moe.top_k} exceeds num_experts = {moe.num_experts}")
        if moe.layer_frequency > num_layers:
            raise AdvisorError(f"{mo}: key 'layer_frequency' = {moe.layer_frequency} exceeds num_layers = {num_layers}")
    published = data.get("published_params")
    if published is not None:
        published = f.positive_float(data, "published_params", origin)
    return ModelSpec(
        name=name,
        source=source,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=f.positive_int(data, "ffn_hidden_size", origin, default=4 * hidden),
        ffn_activation=f.choice(data, "ffn_activation", origin, ("gelu", "swiglu"), default="gelu"),
        vocab_size=f.positive_int(data, "vocab_size", origin),
        seq_length=f.positive_int(data, "seq_length", origin),
        tie_embeddings=f.boolean(data, "tie_embeddings", origin, default=False),
        norm=f.choice(data, "norm", origin, ("layernorm", "rmsnorm"), default="layernorm"),
        moe=moe,
        use_bias=f.boolean(data, "use_bias", origin, default=False),
        position_embedding=f.choice(data, "position_embedding", origin, ("learned", "rotary", "none"), default="rotary"),
        published_params=published,
        notes=data.get("notes"),
    )


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The description as a plain mapping (round-trips through model_from_dict)."""
    out: dict[str, Any] = {
        "name": model.name, "source": model.source, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
        "ffn_activation": model.ffn_activation, "vocab_size": model.vocab_size,
        "seq_length": model.seq_length, "tie_embeddings": model.tie_embeddings, "norm": model.norm,
        "use_bias": model.use_bias, "position_embedding": model.position_embedding,
    }
    if model.moe is not None:
        out["moe"] = {
            "num_experts": model.moe.num_experts, "top_k": model.moe.top_k,
            "expert_ffn_hidden_size": model.moe.expert_ffn_hidden_size,
            "layer_frequency": model.moe.layer_frequency,
        }
    if model.published_params is not None:
        out["published_params"] = model.published_params
    if model.notes is not None:
        out["notes"] = model.notes
    return out


def load_model(name_or_path: str) -> ModelSpec:
    path = f.resolve_bundled(name_or_path, MODELS_DIR, "model")
    return model_from_dict(f.read_mapping(path), str(path))


def bundled_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
