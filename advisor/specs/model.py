"""Model descriptions (models/NAME.yaml): loading, validation and derived figures.

Parameter counts follow the layer layout of Megatron-LM's GPT and Llama implementations:
attention (Q, K, V, output projections; GQA shrinks K and V; an explicit ``head_dim`` may make the
query width differ from the hidden size, as in Qwen3 and gpt-oss; DeepSeek's multi-head latent
attention replaces Q, K and V by low-rank down- and up-projections), the MLP (two matrices for GELU,
three for SwiGLU), norms, token embeddings, optional learned position embeddings, and an untied LM
head. MoE layers add a router, the routed experts and optional shared experts (always active, as in
DeepSeek-V2/V3 and Qwen2-MoE); the first ``first_k_dense_layers`` layers keep a dense MLP.

FLOP counts follow Narayanan et al. SC'21 (Megatron-LM), appendix: a matmul of an (m x k) by a
(k x n) matrix costs 2mkn FLOPs; backward costs twice the forward. Attention's score and context
batched matmuls cost 2 * s_k * (q_width + v_width) per query token and layer in the forward, where
s_k is the number of keys a query attends to. Model FLOPs (the MFU numerator) count a causal
model's attention over the keys it may see: on average half the sequence, as Megatron-LM's
num_floating_point_operations and Megatron-Bridge's published TFLOP/s do (checked against every
Megatron-Bridge row of shared/validation/calibration_runs.yaml in tests/test_models.py); SC'21's
closed form counts the whole s x s product (``causal=False`` reproduces it). A sliding window of w
keys caps s_k at w on the layers that use it (gpt-oss alternates windowed and full layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits as lim
from advisor.specs.bundled import bundled_dir
from advisor.specs.blocks import Linear, MLASpec, MoESpec, mla_from_dict, moe_from_dict
from advisor.families import FAMILIES, family, family_of_model

MODELS_DIR = bundled_dir("models")

_REQUIRED = ("name", "source", "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
_OPTIONAL = (
    "num_kv_heads", "ffn_hidden_size", "ffn_activation", "tie_embeddings", "norm", "moe",
    "use_bias", "position_embedding", "published_params", "notes", "head_dim", "mla", "causal",
    "sliding_window", "sliding_window_every",
)


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
    head_dim_override: int | None = None   # the 'head_dim' key (None: hidden / heads)
    mla: MLASpec | None = None
    causal: bool = True          # decoder LM (False: bidirectional encoder such as BERT)
    sliding_window: int | None = None      # keys per query on windowed layers
    sliding_window_every: int = 1          # every Nth layer is windowed (gpt-oss: 2)

    # ---- shapes -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Query/key width per head (MLA: the no-position and rotary parts together)."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim_override or self.hidden_size // self.num_attention_heads

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @property
    def q_size(self) -> int:
        """Width of the queries of all heads."""
        return self.num_attention_heads * self.head_dim

    @property
    def k_size(self) -> int:
        """Width of the keys one token contributes (MLA: per head after the up-projection)."""
        return (self.num_attention_heads if self.mla is not None else self.num_kv_heads) * self.head_dim

    @property
    def v_size(self) -> int:
        return (self.num_attention_heads if self.mla is not None else self.num_kv_heads) * self.v_head_dim

    @property
    def kv_hidden_size(self) -> int:
        """Mean of the key and value widths (they differ only with MLA)."""
        return (self.k_size + self.v_size) // 2

    @property
    def attention_out_size(self) -> int:
        """Input width of the output projection (heads x value width)."""
        return self.num_attention_heads * self.v_head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices in one MLP: 3 for gated SwiGLU (gate, up, down), 2 for GELU."""
        return 3 if self.ffn_activation == "swiglu" else 2

    def is_moe_layer(self, index: int) -> bool:
        """Megatron's moe_layer_freq convention: layer i (0-based) is MoE when (i + 1) % freq == 0,
        after the first_k_dense_layers dense ones (DeepSeek's first_k_dense_replace)."""
        return self.moe is not None and index >= self.moe.first_k_dense_layers and (index + 1) % self.moe.layer_frequency == 0

    def moe_layers_before(self, index):
        """MoE layers among layers 0 .. index - 1 (numpy-friendly)."""
        if self.moe is None:
            return index * 0
        freq, k = self.moe.layer_frequency, self.moe.first_k_dense_layers
        return np.maximum(np.maximum(index, k) // freq - k // freq, 0)

    @property
    def num_moe_layers(self) -> int:
        return int(self.moe_layers_before(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    def attention_linears(self) -> tuple[Linear, ...]:
        """The attention block's weight matrices (Q, K, V, output; MLA's down/up projections)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla is None:
            return (Linear(h, self.q_size, "column"), Linear(h, self.k_size, "column"),
                    Linear(h, self.v_size, "column"), Linear(self.attention_out_size, h, "row"))
        m = self.mla
        queries = ((Linear(h, m.q_lora_rank, None), Linear(m.q_lora_rank, self.q_size, "column")) if m.q_lora_rank
                   else (Linear(h, self.q_size, "column"),))
        # Megatron-Core's MLA keeps the down-projections whole on every TP rank (parallel_mode duplicated)
        return queries + (Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, None),
                          Linear(m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), "column"),
                          Linear(self.attention_out_size, h, "row"))

    @property
    def attention_params(self) -> int:
        linears = self.attention_linears()
        weights = sum(x.fan_in * x.fan_out for x in linears)
        biases = sum(x.fan_out for x in linears) if self.use_bias else 0
        latent_norms = (self.mla.q_lora_rank + self.mla.kv_lora_rank) if self.mla is not None else 0
        return weights + biases + latent_norms

    def _mlp(self, ff: int) -> int:
        h = self.hidden_size
        biases = ((self.ffn_matrices - 1) * ff + h) if self.use_bias else 0
        return self.ffn_matrices * h * ff + biases

    @property
    def mlp_params(self) -> int:
        return self._mlp(self.ffn_hidden_size)

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP."""
        assert self.moe is not None
        return self._mlp(self.moe.expert_ffn_hidden_size)

    @property
    def shared_expert_params(self) -> int:
        """The shared experts of one MoE layer (replicated like a dense MLP, not expert-parallel)."""
        return self._mlp(self.moe.shared_ffn) if self.moe is not None and self.moe.shared_ffn else 0

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.moe.num_experts if self.moe else 0

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """All experts of one MoE layer plus its attention, norms, router and shared experts."""
        if self.moe is None:
            return 0
        return (self.attention_params + 2 * self.norm_params + self.router_params + self.shared_expert_params
                + self.moe.num_experts * self.expert_params)

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
        attention = (2 if fused_qkv else len(self.attention_linears())) * bias
        if self.moe is None:
            mlp = self.ffn_matrices
        else:
            mlp = (self.moe.num_experts + (1 if self.moe.num_shared_experts else 0)) * self.ffn_matrices + 1
        return 2 * norm + attention + mlp * bias

    # ---- FLOPs --------------------------------------------------------------------------------
    def attention_matmul_params(self) -> int:
        """Attention weights a token multiplies through (every projection, replicated ones too)."""
        return sum(x.fan_in * x.fan_out for x in self.attention_linears())

    def matmul_params_per_token(self) -> int:
        """Weights a token multiplies through (active experts, LM head; not the embedding lookup)."""
        h = self.hidden_size
        attn = self.attention_matmul_params()
        dense = attn + self.ffn_matrices * h * self.ffn_hidden_size
        moe = 0
        if self.moe is not None:
            experts = self.moe.top_k * self.moe.expert_ffn_hidden_size + self.moe.shared_ffn
            moe = attn + self.ffn_matrices * h * experts + h * self.moe.num_experts
        return self.num_dense_layers * dense + self.num_moe_layers * moe + self.vocab_size * h

    def attended_keys(self, seq_length: int, causal: bool | None = None) -> float:
        """Keys a query attends to, averaged over queries and layers (the attention work per query)."""
        causal = self.causal if causal is None else causal
        full = seq_length / 2.0 if causal else float(seq_length)
        if self.sliding_window is None:
            return full
        w = min(self.sliding_window, seq_length)
        # a causal window of w keys: the first w queries see up to w keys, the rest w each
        windowed = w * (1.0 - w / (2.0 * seq_length)) if causal else float(w)
        share = 1.0 / self.sliding_window_every
        return share * windowed + (1.0 - share) * full

    def attention_flops_per_token(self, seq_length: int | None = None, causal: bool | None = None) -> float:
        """Forward score and context matmuls of all layers for one query token."""
        s = seq_length or self.seq_length
        keys = self.attended_keys(s, causal)
        return 2.0 * keys * (self.q_size + self.attention_out_size) * self.num_layers

    def forward_flops_per_token(self, seq_length: int | None = None, causal: bool | None = None) -> float:
        """Forward FLOPs per token: 2 per weight multiply-add plus the attention matmuls (SC'21;
        ``causal=False`` counts the full s x s product as SC'21's closed form does)."""
        return 2.0 * self.matmul_params_per_token() + self.attention_flops_per_token(seq_length, causal)

    def training_flops_per_token(self, seq_length: int | None = None, causal: bool | None = None) -> float:
        """Forward plus backward (backward = 2 x forward, SC'21 appendix): the MFU numerator."""
        return 3.0 * self.forward_flops_per_token(seq_length, causal)


def model_from_dict(data: dict[str, Any], origin: str) -> ModelSpec:
    """A model description of any family (advisor.families: its ``family`` key picks the reader)."""
    name = data.get("family") if isinstance(data, dict) else None
    if name is not None:
        f.choice(data, "family", origin, tuple(FAMILIES))
    return family(name).hook("model_reader")(data, origin)


def transformer_from_dict(data: dict[str, Any], origin: str) -> ModelSpec:
    """A transformer's description (``family: transformer`` or no family key)."""
    data = {k: v for k, v in data.items() if k != "family"}
    f.check_keys(data, origin, _REQUIRED, _OPTIONAL)
    name = f.name(data, "name", origin)
    source = f.text(data, "source", origin)
    num_layers = f.positive_int(data, "num_layers", origin, maximum=lim.MAX_LAYERS)
    hidden = f.positive_int(data, "hidden_size", origin, maximum=lim.MAX_HIDDEN)
    heads = f.positive_int(data, "num_attention_heads", origin, maximum=lim.MAX_HEADS)
    kv_heads = f.positive_int(data, "num_kv_heads", origin, default=heads, maximum=lim.MAX_HEADS)
    head_dim = None if data.get("head_dim") is None else f.positive_int(data, "head_dim", origin, maximum=lim.MAX_HIDDEN)
    if head_dim is None and hidden % heads:
        raise AdvisorError(f"{origin}: key 'num_attention_heads' = {heads} does not divide hidden_size = {hidden} "
                           f"(give 'head_dim' when the heads are not hidden_size / heads wide)")
    if heads % kv_heads:
        raise AdvisorError(f"{origin}: key 'num_kv_heads' = {kv_heads} does not divide num_attention_heads = {heads}")
    moe = moe_from_dict(data["moe"], origin, num_layers) if data.get("moe") is not None else None
    mla = mla_from_dict(data["mla"], origin) if data.get("mla") is not None else None
    if mla is not None and head_dim is not None:
        raise AdvisorError(f"{origin}: key 'head_dim' = {head_dim} conflicts with 'mla' (its head widths are given there)")
    if mla is not None and kv_heads != heads:
        raise AdvisorError(f"{origin}: key 'num_kv_heads' = {kv_heads} conflicts with 'mla', whose keys and values "
                           f"have one head per query head ({heads})")
    published = data.get("published_params")
    if published is not None:
        published = f.positive_float(data, "published_params", origin)
    window = None if data.get("sliding_window") is None else f.positive_int(data, "sliding_window", origin,
                                                                             maximum=lim.MAX_SEQ_LENGTH)
    every = f.positive_int(data, "sliding_window_every", origin, default=1, maximum=lim.MAX_LAYERS)
    if data.get("sliding_window_every") is not None and (window is None or every > num_layers):
        raise AdvisorError(f"{origin}: key 'sliding_window_every' = {every} needs 'sliding_window' and at most "
                           f"num_layers = {num_layers}")
    return ModelSpec(
        name=name,
        source=source,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=f.positive_int(data, "ffn_hidden_size", origin, default=4 * hidden, maximum=lim.MAX_FFN_HIDDEN),
        ffn_activation=f.choice(data, "ffn_activation", origin, ("gelu", "swiglu"), default="gelu"),
        vocab_size=f.positive_int(data, "vocab_size", origin, maximum=lim.MAX_VOCAB),
        seq_length=f.positive_int(data, "seq_length", origin, maximum=lim.MAX_SEQ_LENGTH),
        tie_embeddings=f.boolean(data, "tie_embeddings", origin, default=False),
        norm=f.choice(data, "norm", origin, ("layernorm", "rmsnorm"), default="layernorm"),
        moe=moe,
        use_bias=f.boolean(data, "use_bias", origin, default=False),
        position_embedding=f.choice(data, "position_embedding", origin, ("learned", "rotary", "none"), default="rotary"),
        published_params=published,
        notes=None if data.get("notes") is None else f.text(data, "notes", origin),
        head_dim_override=head_dim,
        mla=mla,
        causal=f.boolean(data, "causal", origin, default=True),
        sliding_window=window,
        sliding_window_every=every,
    )


def model_to_dict(model: ModelSpec) -> dict[str, Any]:
    """The description as a plain mapping (round-trips through model_from_dict)."""
    return family_of_model(model).hook("model_writer")(model)


def transformer_to_dict(model: ModelSpec) -> dict[str, Any]:
    """A transformer's description as a plain mapping."""
    out: dict[str, Any] = {
        "name": model.name, "source": model.source, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
        "num_kv_heads": model.num_kv_heads, "ffn_hidden_size": model.ffn_hidden_size,
        "ffn_activation": model.ffn_activation, "vocab_size": model.vocab_size,
        "seq_length": model.seq_length, "tie_embeddings": model.tie_embeddings, "norm": model.norm,
        "use_bias": model.use_bias, "position_embedding": model.position_embedding,
    }
    if not model.causal:
        out["causal"] = False
    if model.head_dim_override is not None:
        out["head_dim"] = model.head_dim_override
    if model.mla is not None:
        out["mla"] = {"kv_lora_rank": model.mla.kv_lora_rank, "qk_nope_head_dim": model.mla.qk_nope_head_dim,
                      "qk_rope_head_dim": model.mla.qk_rope_head_dim, "v_head_dim": model.mla.v_head_dim,
                      "q_lora_rank": model.mla.q_lora_rank}
    if model.sliding_window is not None:
        out["sliding_window"] = model.sliding_window
        out["sliding_window_every"] = model.sliding_window_every
    if model.moe is not None:
        m = model.moe
        out["moe"] = {"num_experts": m.num_experts, "top_k": m.top_k, "expert_ffn_hidden_size": m.expert_ffn_hidden_size,
                      "layer_frequency": m.layer_frequency}
        if m.first_k_dense_layers:
            out["moe"]["first_k_dense_layers"] = m.first_k_dense_layers
        if m.num_shared_experts:
            out["moe"]["num_shared_experts"] = m.num_shared_experts
        if m.shared_expert_ffn_hidden_size is not None:
            out["moe"]["shared_expert_ffn_hidden_size"] = m.shared_expert_ffn_hidden_size
    if model.published_params is not None:
        out["published_params"] = model.published_params
    if model.notes is not None:
        out["notes"] = model.notes
    return out


def load_model(name_or_path: str) -> ModelSpec:
    """A bundled name, a model description file, or a Hugging Face config.json (advisor.specs.hf_config)."""
    path = f.resolve_bundled(name_or_path, MODELS_DIR, "model")
    data = f.read_mapping(path, "model description")
    if path.suffix == ".json":
        from advisor.specs import hf_config as hf     # only a .json model can be a Hugging Face config (10 ms)

        if hf.is_hf_config(data):
            data = hf.model_from_hf_config(data, str(path), hf.default_name(data, path))
    return model_from_dict(data, str(path))


def model_family(name_or_path: str) -> str | None:
    """The ``family`` key of a model description (a bundled name or a file; None: none given or unreadable,
    the reader reports the problem). A Hugging Face config.json has none: it describes a transformer."""
    try:
        data = f.read_mapping(f.resolve_bundled(name_or_path, MODELS_DIR, "model"), "model description")
    except AdvisorError:
        return None
    value = data.get("family")
    return value if value in FAMILIES else None


def bundled_models(family: str | None = None) -> list[str]:
    """Bundled model names; with `family` ("transformer", "recommendation" or "supernet") only that family's."""
    names = sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
    if family is None:
        return names
    return [n for n in names if (f.read_mapping(MODELS_DIR / f"{n}.yaml").get("family") or "transformer") == family]
