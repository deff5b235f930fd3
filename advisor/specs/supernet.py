"""Supernets for neural architecture search: a transformer description whose every layer chooses one
of several candidate blocks (DESIGN.md, issue 15; one-shot weight-sharing NAS as in SPOS, Guo et al.
ECCV 2020, and HAT, Wang et al. ACL 2020).

```yaml
family: supernet
name: ...                    # the usual transformer keys: num_layers, hidden_size, vocab_size, ...
supernet:
  candidates:                # every layer holds its own copy of each candidate
    - {name: ffn1024-h4, kind: transformer, ffn_hidden_size: 1024, num_attention_heads: 4}
    - {name: conv7, kind: conv, kernel_size: 7}
```

``transformer`` candidates are the model's layer with their own FFN width and head count (heads of
the model's head size); ``conv`` candidates are a lightweight-convolution block (Wu et al., "Pay Less
Attention with Lightweight and Dynamic Convolutions", ICLR 2019; the Lite Transformer's convolution
branch): a GLU input projection h -> 2h, a causal depthwise convolution of the given kernel over the
sequence, an output projection h -> h, with a pre-norm and a residual. The embedding and the output
head are every subnet's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits as lim
from advisor.specs.model import ModelSpec, transformer_from_dict
from advisor.specs.untrusted import prefix

KINDS = ("transformer", "conv")
MAX_CANDIDATES = 64         # NAS spaces per layer: SPOS 4 blocks, HAT 3 FFN x 2 head counts, ET about 10
MAX_KERNEL = 1024            # a bound (advisor.specs.limits style): published kernels reach 11 (ET) and 31 (Wu et al. 2019)


@dataclass(frozen=True)
class Candidate:
    name: str
    kind: str
    ffn_hidden_size: int = 0          # transformer
    num_attention_heads: int = 0      # transformer
    kernel_size: int = 0              # conv

    def layer_model(self, base: ModelSpec) -> ModelSpec:
        """A transformer candidate as the base model's layer with its own FFN width and heads."""
        heads = self.num_attention_heads
        kv = max(1, base.num_kv_heads * heads // base.num_attention_heads)
        return replace(base, ffn_hidden_size=self.ffn_hidden_size, num_attention_heads=heads,
                       num_kv_heads=kv if heads % kv == 0 else heads, head_dim_override=base.head_dim)

    def params(self, base: ModelSpec) -> int:
        h = base.hidden_size
        if self.kind == "conv":
            bias = 3 * h if base.use_bias else 0
            return 2 * h * h + self.kernel_size * h + h * h + 2 * h + bias
        return self.layer_model(base).dense_layer_params


@dataclass(frozen=True)
class SupernetSpec:
    base: ModelSpec                   # the transformer around the choice layers
    candidates: tuple[Candidate, ...]

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def num_layers(self) -> int:
        return self.base.num_layers

    @property
    def family(self) -> str:
        return "supernet"

    @property
    def source(self) -> str:
        return self.base.source

    @property
    def num_params(self) -> int:
        return self.supernet_params

    @property
    def num_active_params(self) -> int:
        """An average subnet's: the embedding, the head and the mean candidate in every layer."""
        mean = sum(c.params(self.base) for c in self.candidates) / len(self.candidates)
        return int(self.num_layers * mean) + self.base.embedding_params + self.base.lm_head_params

    @property
    def supernet_params(self) -> int:
        """Every candidate of every layer, the embedding and the head."""
        per_layer = sum(c.params(self.base) for c in self.candidates)
        return self.num_layers * per_layer + self.base.embedding_params + self.base.lm_head_params


def _candidate(item: Any, origin: str, base: ModelSpec) -> Candidate:
    if not isinstance(item, dict):
        raise AdvisorError(f"{origin} must be a mapping with keys name and kind, got {prefix(item)}")
    kind = f.choice(item, "kind", origin, KINDS)
    name = f.name(item, "name", origin)
    if kind == "conv":
        f.check_keys(item, origin, ("name", "kind", "kernel_size"), ())
        return Candidate(name, kind, kernel_size=f.positive_int(item, "kernel_size", origin, maximum=MAX_KERNEL))
    f.check_keys(item, origin, ("name", "kind"), ("ffn_hidden_size", "num_attention_heads"))
    heads = f.positive_int(item, "num_attention_heads", origin, default=base.num_attention_heads, maximum=lim.MAX_HEADS)
    ffn = f.positive_int(item, "ffn_hidden_size", origin, default=base.ffn_hidden_size, maximum=lim.MAX_HIDDEN)
    return Candidate(name, kind, ffn_hidden_size=ffn, num_attention_heads=heads)


def supernet_from_dict(data: dict[str, Any], origin: str) -> SupernetSpec:
    """A model description of ``family: supernet`` (advisor.specs.model.model_from_dict hands it here)."""
    data = {k: v for k, v in data.items() if k != "family"}

    o = f"{origin}: supernet"
    if "supernet" not in data or not isinstance(block := data["supernet"], dict):
        raise AdvisorError(f"{o} must be a mapping with key 'candidates'")
    f.check_keys(block, o, ("candidates",), ())
    items = block["candidates"]
    if not isinstance(items, list) or not 2 <= len(items) <= MAX_CANDIDATES:
        raise AdvisorError(f"{o}: key 'candidates' must list 2 to {MAX_CANDIDATES} blocks, got {prefix(items)}")
    base = transformer_from_dict({k: v for k, v in data.items() if k != "supernet"}, origin)
    if base.moe is not None or base.mla is not None:
        raise AdvisorError(f"{o}: a supernet's layers are its candidates; the base cannot also be MoE or MLA")
    candidates = tuple(_candidate(item, f"{o}: candidates[{i}]", base) for i, item in enumerate(items))
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise AdvisorError(f"{o}: candidate names must differ, {sorted(n for n in names if names.count(n) > 1)[0]!r} repeats")
    return SupernetSpec(base, candidates)


def supernet_to_dict(net: SupernetSpec) -> dict[str, Any]:
    """The description as a plain mapping (round-trips through model_from_dict)."""
    from advisor.specs.model import model_to_dict

    def candidate(c: Candidate) -> dict[str, Any]:
        if c.kind == "conv":
            return {"name": c.name, "kind": c.kind, "kernel_size": c.kernel_size}
        return {"name": c.name, "kind": c.kind, "ffn_hidden_size": c.ffn_hidden_size,
                "num_attention_heads": c.num_attention_heads}

    return {"family": "supernet", **model_to_dict(net.base), "supernet": {"candidates": [candidate(c) for c in net.candidates]}}


@dataclass(frozen=True)
class SupernetRun:
    """What to price: subnets sampled with a seed, the pipeline, and whether the ends train."""
    subnets: int = 64
    seed: int = 0
    train_shared: bool = False
    window: int | None = None      # subnets in flight (None: the pipeline depth)
    context_switch: bool = False   # candidates' weights in host memory, swapped in per subnet (NASPipe)
    checkpoint: bool = False       # each stage's forward recomputed in the backward (NASPipe's runtime)

    def to_dict(self) -> dict:
        return {"subnets": self.subnets, "seed": self.seed, "train_shared": self.train_shared,
                **({"window": self.window} if self.window is not None else {}),
                **({"context_switch": True} if self.context_switch else {}),
                **({"checkpoint": True} if self.checkpoint else {})}

    @property
    def memory_knobs(self) -> str:
        """The table's label of what this run does to fit: ckpt, host, both, or -."""
        return "+".join(k for k, on in (("ckpt", self.checkpoint), ("host", self.context_switch)) if on) or "-"
