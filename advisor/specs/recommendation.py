"""Embedding-heavy recommendation models (``family: recommendation``): embedding tables feeding dense towers.

The layout is DLRM's (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", arXiv 1906.00091, section 2; facebookresearch/dlrm dlrm_s_pytorch.py):

* dense features -> bottom MLP (Linear + ReLU per layer, weights and biases);
* each embedding table is looked up ``lookups_per_sample`` times per sample; ``pooling: sum`` adds
  the rows into one vector of ``dim`` (DLRM's EmbeddingBag mode "sum"), ``pooling: concat`` keeps
  them side by side (lookups x dim wide: one field per lookup, as the Wide&Deep model of MindSpore's
  model zoo embeds its 39 fields from one shared table);
* interaction ``dot``: the pairwise dot products of the F = tables (+ 1 for the bottom-MLP output)
  vectors, strictly lower triangle (DLRM's arch-interaction-itself off), concatenated with the
  bottom-MLP output: F(F-1)/2 + bottom width; ``cat``: the vectors concatenated;
* top MLP to the logit.

``unique_row_fraction`` is the share of a batch's lookups that hit distinct rows (1.0, the
default, assumes no reuse inside a batch: an upper bound on the rows a step touches; measured
datasets are lower, e.g. Criteo's power-law ids). The cost model caps it at the table's rows.
All parameters are fp32 (the DLRM reference and MindSpore's Wide&Deep train fp32 tables).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import _fields as f
from advisor.specs import limits as lim

FAMILY = "recommendation"
INTERACTIONS = ("dot", "cat")
POOLINGS = ("sum", "concat")
PARAM_BYTES = 4          # fp32 tables and towers (module docstring)
INDEX_BYTES = 8          # int64 row ids (PyTorch EmbeddingBag indices; ps-lite's uint64 keys, Li et al. 2014)

_REQUIRED = ("family", "name", "source", "embedding_tables", "dense")
_OPTIONAL = ("dense_features", "unique_row_fraction", "global_batch_size", "published_params", "notes")
_TABLE_REQUIRED = ("name", "rows", "dim", "lookups_per_sample", "sparse")
_TABLE_OPTIONAL = ("pooling",)
_DENSE_REQUIRED = ("top_mlp", "interaction")
_DENSE_OPTIONAL = ("bottom_mlp",)
# Table names become parameter names in exports (set_param_ps) and plan keys: identifiers only.
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class EmbeddingTable:
    name: str
    rows: int
    dim: int
    lookups_per_sample: float    # ids per sample (1 for one-hot Criteo fields; the mean for multi-hot)
    sparse: bool                 # gradients as touched rows only (EmbeddingBag sparse=True, MindSpore sparse)
    pooling: str = "sum"         # sum | concat

    @property
    def params(self) -> int:
        return self.rows * self.dim

    @property
    def output_width(self) -> int:
        """Values per sample after pooling."""
        return self.dim if self.pooling == "sum" else int(self.lookups_per_sample) * self.dim


@dataclass(frozen=True)
class RecModelSpec:
    name: str
    source: str
    tables: tuple[EmbeddingTable, ...]
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    interaction: str
    dense_features: int = 0
    unique_row_fraction: float = 1.0
    global_batch_size: int | None = None     # batch of the published training (default for recommend)
    published_params: float | None = None
    notes: str | None = None

    family = FAMILY
    moe = None                # transformer-only knobs some shared code looks at
    seq_length = 1            # one sample is one "token" of a step: tokens/s are samples/s

    # ---- shapes -------------------------------------------------------------------------------
    @property
    def bottom_width(self) -> int:
        """Width of the dense input to the interaction (the bottom MLP's output, or the raw features)."""
        return self.bottom_mlp[-1] if self.bottom_mlp else self.dense_features

    @property
    def interaction_vectors(self) -> int:
        """F: the vectors that interact (pooled tables, plus the dense one when there is one)."""
        return len(self.tables) + (1 if self.bottom_width > 0 else 0)

    @property
    def interaction_width(self) -> int:
        if self.interaction == "dot":
            n = self.interaction_vectors
            return n * (n - 1) // 2 + self.bottom_width
        return self.bottom_width + sum(t.output_width for t in self.tables)

    def mlp_layers(self) -> tuple[tuple[str, int, int], ...]:
        """(name, fan_in, fan_out) of every Linear, bottom tower first."""
        out = []
        widths = (self.dense_features,) + self.bottom_mlp
        out += [(f"bottom_mlp_{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
        widths = (self.interaction_width,) + self.top_mlp
        out += [(f"top_mlp_{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
        return tuple(out)

    @property
    def num_layers(self) -> int:
        """Linear layers of both towers (the plan's one pipeline stage holds them all)."""
        return len(self.bottom_mlp) + len(self.top_mlp)

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return sum(t.params for t in self.tables)

    @property
    def dense_params(self) -> int:
        """Weights and biases of both MLPs."""
        return sum(a * b + b for _, a, b in self.mlp_layers())

    @property
    def num_params(self) -> int:
        return self.embedding_params + self.dense_params

    @property
    def num_active_params(self) -> int:
        return self.num_params

    def tensor_params(self) -> dict[str, int]:
        """Every parameter tensor a server may hold, by name: the tables, then one entry per Linear
        (weight and bias together)."""
        out = {t.name: t.params for t in self.tables}
        out.update({name: a * b + b for name, a, b in self.mlp_layers()})
        return out

    # ---- work per sample ----------------------------------------------------------------------
    def mlp_forward_flops_per_sample(self) -> float:
        """2 FLOPs per multiply-add of every Linear (Narayanan et al. SC'21 appendix convention)."""
        return 2.0 * sum(a * b for _, a, b in self.mlp_layers())

    def interaction_forward_flops_per_sample(self) -> float:
        """dot: the batched (F x d)(d x F) product, 2 F^2 d (DLRM's torch.bmm); cat: none."""
        if self.interaction != "dot":
            return 0.0
        n = self.interaction_vectors
        d = self.tables[0].dim
        return 2.0 * n * n * d

    def training_flops_per_sample(self) -> float:
        """Forward plus backward (backward = 2 x forward for matmuls, SC'21 appendix)."""
        return 3.0 * (self.mlp_forward_flops_per_sample() + self.interaction_forward_flops_per_sample())

    def gathered_bytes_per_sample(self) -> float:
        """Embedding rows read by the forward lookups of one sample (fp32)."""
        return sum(t.lookups_per_sample * t.dim * PARAM_BYTES for t in self.tables)

    def pooled_width(self) -> int:
        """Embedding values per sample after pooling (what an all-to-all of sharded tables moves)."""
        return sum(t.output_width for t in self.tables)

    def activation_bytes_per_sample(self, dtype_bytes: int) -> float:
        """Bytes autograd keeps for backward per sample, each tensor once (DLRM's forward as PyTorch
        runs it): a tower's input (saved by its first Linear) and every layer's output (ReLU saves its
        result, which is also the next Linear's saved input; the last output is saved by the loss);
        for the dot interaction the stacked vectors (bmm saves them); and the int64 ids of the
        lookups. Backward formulas in PyTorch's tools/autograd/derivatives.yaml: embedding keeps its
        indices; embedding_bag keeps indices, offsets, offset2bag and bag_size, which on PyTorch 2.13
        is one int64 per id plus three per bag (measured with saved_tensors_hooks). The pooled rows
        are not kept: neither cat nor the sum of a bag needs them for backward."""
        bottom = self.dense_features + sum(self.bottom_mlp)
        top = self.interaction_width + sum(self.top_mlp)
        stacked = self.bottom_width + self.pooled_width() if self.interaction == "dot" else 0
        ids = sum(t.lookups_per_sample + (3 if t.pooling == "sum" else 0) for t in self.tables)
        return (bottom + top + stacked) * dtype_bytes + ids * INDEX_BYTES

    def activation_bytes_per_batch(self) -> float:
        """Bytes kept once per micro-batch whatever its size: the dot interaction's pair indices
        (torch.tril_indices, 2 x F(F-1)/2 int64, kept by the gather of the lower triangle, as the DLRM
        reference code indexes Z[:, li, lj])."""
        if self.interaction != "dot":
            return 0.0
        n = self.interaction_vectors
        return 2 * (n * (n - 1) // 2) * INDEX_BYTES


def is_recommendation(data: Any) -> bool:
    return isinstance(data, dict) and data.get("family") == FAMILY


def _int_list(data: dict[str, Any], key: str, origin: str, allow_empty: bool) -> tuple[int, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or (not value and not allow_empty) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value):
        raise AdvisorError(f"{origin}: key '{key}' must be a {'' if allow_empty else 'non-empty '}list of "
                           f"positive integers (layer widths), got {str(value)[:80]!r}")
    return tuple(value)


def _table(data: Any, origin: str) -> EmbeddingTable:
    f.check_keys(data, origin, _TABLE_REQUIRED, _TABLE_OPTIONAL)
    name = f.text(data, "name", origin)
    if not _NAME.match(name):
        raise AdvisorError(f"{origin}: key 'name' must be an identifier (letters, digits, '_', at most 64), "
                           f"got {name[:40]!r}")
    pooling = f.choice(data, "pooling", origin, POOLINGS, default="sum")
    lookups = f.positive_float(data, "lookups_per_sample", origin)
    if pooling == "concat" and lookups != int(lookups):
        raise AdvisorError(f"{origin}: key 'lookups_per_sample' = {lookups} must be a whole number with pooling concat")
    return EmbeddingTable(name=name, rows=f.positive_int(data, "rows", origin, maximum=lim.MAX_EMBEDDING_ROWS),
                          dim=f.positive_int(data, "dim", origin, maximum=lim.MAX_HIDDEN),
                          lookups_per_sample=lookups, sparse=f.boolean(data, "sparse", origin), pooling=pooling)


def rec_model_from_dict(data: dict[str, Any], origin: str) -> RecModelSpec:
    f.check_keys(data, origin, _REQUIRED, _OPTIONAL)
    f.choice(data, "family", origin, (FAMILY,))
    raw_tables = data["embedding_tables"]
    if not isinstance(raw_tables, list) or not raw_tables:
        raise AdvisorError(f"{origin}: key 'embedding_tables' must be a non-empty list of tables, got {str(raw_tables)[:80]!r}")
    tables = tuple(_table(t, f"{origin}: embedding_tables[{i}]") for i, t in enumerate(raw_tables))
    seen: set[str] = set()
    for i, t in enumerate(tables):
        if t.name in seen:
            raise AdvisorError(f"{origin}: embedding_tables[{i}]: key 'name' = {t.name!r} repeats an earlier table")
        seen.add(t.name)
    do = f"{origin}: dense"
    dense = data["dense"]
    f.check_keys(dense, do, _DENSE_REQUIRED, _DENSE_OPTIONAL)
    bottom = _int_list(dense, "bottom_mlp", do, allow_empty=True)
    top = _int_list(dense, "top_mlp", do, allow_empty=False)
    interaction = f.choice(dense, "interaction", do, INTERACTIONS)
    features = f.non_negative_int(data, "dense_features", origin, default=0)
    if bottom and features == 0:
        raise AdvisorError(f"{do}: key 'bottom_mlp' = {list(bottom)} needs 'dense_features' > 0 (its input width)")
    if any(name in seen for name in ("bottom_mlp", "top_mlp")) or any(n.startswith(("bottom_mlp_", "top_mlp_")) for n in seen):
        raise AdvisorError(f"{origin}: embedding table names must not start with 'bottom_mlp_' or 'top_mlp_' "
                           f"(those name the towers' layers)")
    if interaction == "dot":
        dims = {t.dim for t in tables}
        width = bottom[-1] if bottom else features
        if len(dims) != 1 or any(t.pooling != "sum" for t in tables) or (width and width not in dims):
            raise AdvisorError(f"{do}: key 'interaction' = 'dot' needs every table pooled by sum to one dim and the "
                               f"bottom MLP to end at that dim (dims {sorted(dims)}, bottom output {width})")
    published = None if data.get("published_params") is None else f.positive_float(data, "published_params", origin)
    return RecModelSpec(
        name=f.name(data, "name", origin), source=f.text(data, "source", origin), tables=tables,
        bottom_mlp=bottom, top_mlp=top, interaction=interaction, dense_features=features,
        unique_row_fraction=f.fraction(data, "unique_row_fraction", origin, default=1.0),
        global_batch_size=(None if data.get("global_batch_size") is None
                           else f.positive_int(data, "global_batch_size", origin)),
        published_params=published,
        notes=None if data.get("notes") is None else f.text(data, "notes", origin),
    )


def rec_model_to_dict(model: RecModelSpec) -> dict[str, Any]:
    """The description as a plain mapping (round-trips through rec_model_from_dict)."""
    tables = []
    for t in model.tables:
        lookups = int(t.lookups_per_sample) if t.lookups_per_sample == int(t.lookups_per_sample) else t.lookups_per_sample
        row = {"name": t.name, "rows": t.rows, "dim": t.dim, "lookups_per_sample": lookups, "sparse": t.sparse}
        if t.pooling != "sum":
            row["pooling"] = t.pooling
        tables.append(row)
    out: dict[str, Any] = {
        "family": FAMILY, "name": model.name, "source": model.source, "embedding_tables": tables,
        "dense": {"bottom_mlp": list(model.bottom_mlp), "top_mlp": list(model.top_mlp), "interaction": model.interaction},
        "dense_features": model.dense_features, "unique_row_fraction": model.unique_row_fraction,
    }
    for key in ("global_batch_size", "published_params", "notes"):
        if getattr(model, key) is not None:
            out[key] = getattr(model, key)
    return out
