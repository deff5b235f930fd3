"""Run a plan's operator layouts (D-Rec, the ILP or the user's shard() strategies) as planned, with
DTensor placements on the tensor-parallel group's mesh.

A plan's ``operator_strategies`` (advisor.search.intra_op.record) give the group's mesh (the size of
each axis, outermost first) and, for every operator of the layer template (and the embedding, final
norm, LM head and loss when its graph is the whole model), the label each mesh axis cuts (b batch,
s sequence, h hidden, g key/value heads, f FFN hidden, v vocabulary, t key positions). Here every
label of an operator's tensors names one dimension of the executor's tensor (the module tree of
advisor.executor.model, table ``OPERATORS``): an axis that cuts a label the tensor has is
``Shard(that dimension)``, any other axis ``Replicate``.

* Parameters live in the placements of the operator that reads them (distribute_tensor).
* Before an operator runs, its activation inputs are redistributed to its placements
  (DTensor's redistribute: the all-gathers, all-to-alls and all-reduces of the layout's edges);
  DTensor's sharding propagation then computes the operator on the cut, leaving Partial sums where
  the cut contracts (a cut of h in a matmul), which the next operator's redistribution resolves.
* Attention runs on each rank's shards (its batch rows, heads and query positions, all keys), causal
  by the query shard's global positions, with the rotary embedding of those positions: DTensor has
  no sharding rule for fused attention on CPU, and this is what the cut computes.
* The loss is Megatron's vocabulary-parallel cross entropy over the mesh axes that cut the
  vocabulary (three fp32 statistics per token all-reduced), on the batch and sequence shards of the
  others.

Operators the record does not list (the embedding, final norm, LM head and loss of a
pipeline-parallel plan, whose graph holds one stage's layers) take Megatron's cut on every axis
(advisor.specs.operator_strategies.MEGATRON_CUTS), as the plan's pricing assumes. Between pipeline
stages each rank hands on its shard of the last residual add's output (as Megatron hands on its
sequence-parallel shard).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from advisor.errors import AdvisorError
from advisor.executor.model import _rotary, _VocabParallelCrossEntropy, causal_attention
from advisor.specs.operator_strategies import MAX_OPERATORS, MEGATRON_CUTS, SEQUENCE
from advisor.specs.untrusted import prefix

BSH = {"b": 0, "s": 1, "h": 2}
BS = {"b": 0, "s": 1}


@dataclass(frozen=True)
class OperatorSpec:
    """How one operator of the graph maps onto the executor: its activation inputs (where each is
    redistributed, and the executor dimension of each label) and its parameters (the executor's
    parameter paths relative to the block, or to the model for the ends, and the dimension of each
    label; paths a model variant does not have are skipped)."""

    inputs: tuple[tuple[str, dict[str, int]], ...]
    params: tuple[tuple[tuple[str, ...], dict[str, int]], ...] = ()
    in_layer: bool = True

    @property
    def labels(self) -> set[str]:
        out = set()
        for _, dims in self.inputs + self.params:
            out.update(dims)
        return out


# graph operator (its name within the layer) -> the executor's tensors (advisor.graph.transformer's labels)
OPERATORS: dict[str, OperatorSpec] = {
    "embed": OperatorSpec((("embed", BS),), ((("embed.tok.weight",), {"v": 0, "h": 1}),
                                             (("embed.pos.weight",), {"s": 0, "h": 1})), in_layer=False),
    # a norm's h is never cut (the graph's no_cut): its weights whole, its input cut by batch or sequence only
    "ln1": OperatorSpec((("norm1", BS),), ((("norm1.weight", "norm1.bias"), {}),)),
    "qkv": OperatorSpec((("attn", BSH),), ((("attn.q.weight", "attn.k.weight", "attn.v.weight"), {"g": 0, "h": 1}),
                                          (("attn.q.bias", "attn.k.bias", "attn.v.bias"), {"g": 0}))),
    # the core reads the projections' outputs [b, s, heads x d] (whole heads, GQA groups consecutive); the keys'
    # positions t are never cut (the graph's no_cut: a cut of s gathers K and V)
    "attn": OperatorSpec((("attn.core.q", {"b": 0, "s": 1, "g": 2}), ("attn.core.kv", {"b": 0, "g": 2}))),
    "proj": OperatorSpec((("attn.o", {"b": 0, "s": 1, "g": 2}),), ((("attn.o.weight",), {"h": 0, "g": 1}),)),
    "res1": OperatorSpec((("res1", BSH),), ((("attn.o.bias",), {"h": 0}),)),
    "ln2": OperatorSpec((("norm2", BS),), ((("norm2.weight", "norm2.bias"), {}),)),
    "fc1": OperatorSpec((("mlp", BSH),), ((("mlp.fc1.weight", "mlp.gate.weight", "mlp.up.weight"), {"f": 0, "h": 1}),
                                         (("mlp.fc1.bias", "mlp.gate.bias", "mlp.up.bias"), {"f": 0}))),
    "fc2": OperatorSpec((("mlp.out", {"b": 0, "s": 1, "f": 2}),),
                        ((("mlp.fc2.weight", "mlp.down.weight"), {"h": 0, "f": 1}),)),
    "res2": OperatorSpec((("res2", BSH),), ((("mlp.fc2.bias", "mlp.down.bias"), {"h": 0}),)),
    "lnf": OperatorSpec((("norm", BS),), ((("norm.weight", "norm.bias"), {}),), in_layer=False),
    "head": OperatorSpec((("head", BSH),), ((("head.weight",), {"v": 0, "h": 1}),), in_layer=False),
    "loss": OperatorSpec((("loss.logits", {"b": 0, "s": 1, "v": 2}), ("loss.targets", BS)), in_layer=False),
}
MAX_AXES = 8


@dataclass(frozen=True)
class OperatorLayout:
    """The layout one run executes: the group's mesh and, per operator, the label each axis cuts
    (None: replicated); ``listed``: the operators the plan's record gave (the others are Megatron's)."""

    mesh_shape: tuple[int, ...]
    cuts: tuple[tuple[str, tuple[str | None, ...]], ...]
    listed: tuple[str, ...]
    searcher: str = "plan"

    def axes(self, op: str) -> tuple[str | None, ...]:
        return dict(self.cuts)[op]

    def parts(self, op: str, label: str) -> int:
        """Into how many parts the operator's mesh axes cut ``label``."""
        return math.prod(n for lab, n in zip(self.axes(op), self.mesh_shape) if lab == label)

    def placements(self, op: str, dims: dict[str, int]):
        """The DTensor placements, one per mesh axis, of an operator's tensor whose labels sit at ``dims``."""
        return tuple(Shard(dims[lab]) if lab in dims else Replicate() for lab in self.axes(op))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "OperatorLayout":
        """The inverse of dataclasses.asdict through JSON (how a RunConfig travels to the ranks)."""
        return OperatorLayout(tuple(d["mesh_shape"]), tuple((op, tuple(a)) for op, a in d["cuts"]),
                              tuple(d["listed"]), d.get("searcher", "plan"))


def layout_from_plan(rec: Any, tp: int, sequence_parallel: bool) -> OperatorLayout:
    """The layout of a plan's ``operator_strategies`` record for a tensor-parallel group of ``tp`` devices;
    AdvisorError naming the key when the record is malformed or cuts what the executor's tensors cannot."""
    where = "plan operator_strategies"
    if not isinstance(rec, dict):
        raise AdvisorError(f"{where}: must be a mapping, got {type(rec).__name__}")
    mesh = rec.get("mesh", [tp])
    if (not isinstance(mesh, list) or not 1 <= len(mesh) <= MAX_AXES
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in mesh)):
        raise AdvisorError(f"{where}.mesh: must be a list of at most {MAX_AXES} positive integers, got {mesh!r}")
    if math.prod(mesh) != tp:
        raise AdvisorError(f"{where}.mesh: {mesh} holds {math.prod(mesh)} devices, but parallel.tp is {tp}")
    operators = rec.get("operators")
    if not isinstance(operators, dict) or len(operators) > MAX_OPERATORS:
        raise AdvisorError(f"{where}.operators: must be a mapping of at most {MAX_OPERATORS} operator names to their "
                           "cuts (a plan from advisor recommend --searcher drec|ilp)")
    given: dict[str, tuple[str | None, ...]] = {}
    for name, op in operators.items():
        base = str(name).rsplit(".", 1)[-1]
        if base not in OPERATORS:
            raise AdvisorError(f"{where}.operators[{prefix(name)}]: the executor runs dense transformer "
                               f"operators only ({', '.join(OPERATORS)})")
        axes = op.get("mesh_axes") if isinstance(op, dict) else None
        if not isinstance(axes, list) or len(axes) != len(mesh) or not all(a is None or isinstance(a, str) for a in axes):
            raise AdvisorError(f"{where}.operators[{prefix(name)}].mesh_axes: must list one label (or null) per mesh axis "
                               f"({len(mesh)}), got {prefix(axes)}")
        unknown = sorted({a for a in axes if a is not None} - OPERATORS[base].labels)
        if unknown:
            raise AdvisorError(f"{where}.operators[{prefix(name)}].mesh_axes: cuts {', '.join(map(prefix, unknown))}, which no "
                               f"tensor of the executor's {base} splits (it can cut "
                               f"{', '.join(sorted(OPERATORS[base].labels))})")
        if base in given and given[base] != tuple(axes):
            raise AdvisorError(f"{where}.operators[{prefix(name)}]: two layers of the template cut {base} differently")
        given[base] = tuple(axes)
    fallback = SEQUENCE if sequence_parallel else None
    cuts = tuple((op, given.get(op, (MEGATRON_CUTS.get(op, fallback),) * len(mesh))) for op in OPERATORS)
    searcher = rec.get("searcher")
    searcher = searcher if isinstance(searcher, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,20}", searcher) else "plan"
    return OperatorLayout(tuple(mesh), cuts, tuple(op for op in OPERATORS if op in given), searcher)


def check_divides(layout: OperatorLayout, sizes: dict[str, int]) -> list[str]:
    """Sentences for every cut the run's dimensions (``sizes``: label -> length) do not divide."""
    problems = []
    for op, axes in layout.cuts:
        for lab in dict.fromkeys(a for a in axes if a is not None):
            parts = layout.parts(op, lab)
            if sizes.get(lab, 1) % parts:
                problems.append(f"operator_strategies: {op} cuts {lab} ({sizes.get(lab)}) into {parts} parts, "
                                "which do not divide it")
    return problems


# ---- applying a layout to the executor's model (torch from here on) ---------------------------------------
def _to(x, mesh, placements):
    """``x`` (a DTensor, or a plain tensor every rank holds whole) in ``placements`` on ``mesh``."""
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, run_check=False)
    if tuple(x.placements) != tuple(placements):
        x = x.redistribute(mesh, placements)
    return x


def _offset(x, dim: int) -> int:
    """The global index of this rank's first element of DTensor ``x`` along ``dim``."""
    _, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)
    return int(offset[dim])


def _get(root, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _distribute_params(root, spec: OperatorSpec, layout: OperatorLayout, op: str, mesh, done: dict) -> None:
    for paths, dims in spec.params:
        placements = layout.placements(op, dims)
        for path in paths:
            module_path, _, name = path.rpartition(".")
            module = _get(root, module_path)
            param = getattr(module, name, None) if module is not None else None
            if not isinstance(param, nn.Parameter):
                continue
            if id(param) in done:          # a tied table: one copy (config.layout_refusals: both cut it alike)
                setattr(module, name, done[id(param)])
                continue
            new = nn.Parameter(distribute_tensor(param.data, mesh, list(placements)), requires_grad=param.requires_grad)
            new.register_post_accumulate_grad_hook(_gradient_as_parameter)
            done[id(param)] = new
            setattr(module, name, new)


def _gradient_as_parameter(param) -> None:
    """DTensor's backward may hand a parameter's gradient back in other placements than the parameter's (a
    whole-size Partial sum for a weight cut by h): kept in the parameter's own (a reduce-scatter), as the
    data-parallel reduction and the optimizers step local shards."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


def _pre_hook(mesh, placements):
    def hook(module, args):
        return (_to(args[0], mesh, placements),) + tuple(args[1:])
    return hook


def apply_operator_layout(model, mesh, layout: OperatorLayout, attention: str, rotary: bool) -> None:
    """Put one model chunk (advisor.executor.model.GPT) in the layout on the group's ``mesh`` (see the module doc)."""
    done: dict = {}
    if model.embed is not None:
        _distribute_params(model, OPERATORS["embed"], layout, "embed", mesh, done)
        model.embed.register_forward_pre_hook(_pre_hook(mesh, layout.placements("embed", BS)))
        model.embed.lookup = ShardedLookup(mesh)
        # a vocabulary cut leaves the lookup's sum pending (DTensor's MaskPartial, which can be reduced only
        # once): resolved into the first layer's placements, where both the norm and the residual read it
        model.embed.register_forward_hook(_post_hook(mesh, layout.placements("ln1", BSH)))
    for block in model.layers.values():
        for op, spec in OPERATORS.items():
            if spec.in_layer:
                _distribute_params(block, spec, layout, op, mesh, done)
        block.norm1.register_forward_pre_hook(_pre_hook(mesh, layout.placements("ln1", BSH)))
        block.attn.register_forward_pre_hook(_pre_hook(mesh, layout.placements("qkv", BSH)))
        block.attn.o.register_forward_pre_hook(_pre_hook(mesh, layout.placements("proj", OPERATORS["proj"].inputs[0][1])))
        block.norm2.register_forward_pre_hook(_pre_hook(mesh, layout.placements("ln2", BSH)))
        block.mlp.register_forward_pre_hook(_pre_hook(mesh, layout.placements("fc1", BSH)))
        out = block.mlp.down if block.mlp.swiglu else block.mlp.fc2
        out.register_forward_pre_hook(_pre_hook(mesh, layout.placements("fc2", OPERATORS["fc2"].inputs[0][1])))
        block.adds = (_residual(mesh, layout.placements("res1", BSH)), _residual(mesh, layout.placements("res2", BSH)))
        block.attn.rotary = False         # applied to each shard by its global positions (sharded_attention)
        block.attn.core.sharded = ShardedAttention(mesh, layout.placements("attn", OPERATORS["attn"].inputs[0][1]),
                                                   layout.placements("attn", OPERATORS["attn"].inputs[1][1]),
                                                   block.attn.head_dim, flash=attention == "flash", rotary=rotary)
    # between pipeline stages: each rank's shard of the last residual add's output (res2's cut), as Megatron hands
    # on its sequence-parallel shard
    boundary = layout.placements("res2", BSH)
    if model.embed is None:
        model.register_forward_pre_hook(_stage_input(mesh, boundary))
    if model.head is not None:
        _distribute_params(model, OPERATORS["lnf"], layout, "lnf", mesh, done)
        _distribute_params(model, OPERATORS["head"], layout, "head", mesh, done)
        model.norm.register_forward_pre_hook(_pre_hook(mesh, layout.placements("lnf", BSH)))
        model.head.register_forward_pre_hook(_pre_hook(mesh, layout.placements("head", BSH)))
    else:
        model.register_forward_hook(_stage_output(mesh, boundary))


def _post_hook(mesh, placements):
    def hook(module, args, output):
        return _to(output, mesh, placements)
    return hook


def _stage_input(mesh, placements):
    def hook(module, args):
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, placements, run_check=False)
        return (x,) + tuple(args[1:])
    return hook


def _stage_output(mesh, placements):
    def hook(module, args, output):
        return _to(output, mesh, placements).to_local()
    return hook


def stage_activation_shape(layout: OperatorLayout, batch: int, seq: int, hidden: int) -> tuple[int, int, int]:
    """The shape of the shard one rank hands to the next pipeline stage (res2's cut of [b, s, h])."""
    return batch // layout.parts("res2", "b"), seq // layout.parts("res2", "s"), hidden // layout.parts("res2", "h")


def _residual(mesh, placements):
    def add(y, x):
        return _to(x, mesh, placements) + _to(y, mesh, placements)
    return add


def _shares(placements, readers):
    """The gradient placements of a tensor in ``placements`` read by shards in ``readers`` (both per mesh
    axis): Partial (each rank's gradient a share of the sum) where the tensor is whole and its reader cut."""

    return tuple(Partial() if isinstance(p, Replicate) and isinstance(r, Shard) else p
                 for p, r in zip(placements, readers))


class ShardedLookup:
    """The embedding lookup on each rank's shard of the table [v, h] (Megatron's vocabulary-parallel
    embedding where an axis cuts v: rows outside the shard look up zeros, the sum over that axis pending):
    the output [b, s, h] is Partial over the axes that cut v, and cut as the tokens and the table's h
    over the others. (DTensor's own rule keeps one mask per tensor, so it cannot cut v on two axes.)"""

    def __init__(self, mesh):
        self.mesh = mesh

    def __call__(self, tokens, weight):
        # the table whole where the tokens are cut: each rank's gradient is its tokens' share
        ids, table = tokens.to_local(), weight.to_local(grad_placements=_shares(weight.placements, tokens.placements))
        start, rows = _offset(weight, 0), table.shape[0]
        local = ids - start
        inside = (local >= 0) & (local < rows)
        out = F.embedding(torch.where(inside, local, torch.zeros_like(local)), table) * inside.unsqueeze(-1)
        placements = [Partial() if isinstance(w, Shard) and w.dim == 0 else
                      (Shard(2) if isinstance(w, Shard) and w.dim == 1 else t)
                      for w, t in zip(weight.placements, tokens.placements)]
        b, s = tokens.shape
        return DTensor.from_local(out.to(table.dtype), self.mesh, placements, run_check=False,
                                  shape=(b, s, weight.shape[1]), stride=(s * weight.shape[1], weight.shape[1], 1))


class ShardedAttention:
    """Causal attention on each rank's shards of the projections' outputs q [b, s, heads x d] and k, v
    [b, t, kv_heads x d] in the attention operator's placements: the query shard's global positions set
    its causal mask and its rotary angles; the result [b, s, heads x d] keeps q's placements. Heads are
    split and merged on the local tensors (a DTensor view of a cut head dimension cannot always be one)."""

    def __init__(self, mesh, q_placements, kv_placements, head_dim: int, flash: bool, rotary: bool):
        self.mesh, self.q_pl, self.kv_pl = mesh, tuple(q_placements), tuple(kv_placements)
        self.head_dim, self.flash, self.rotary = head_dim, flash, rotary

    def __call__(self, q, k, v):
        q, k, v = _to(q, self.mesh, self.q_pl), _to(k, self.mesh, self.kv_pl), _to(v, self.mesh, self.kv_pl)
        # keys and values whole where the queries are cut by position: each rank's gradient is its queries' share
        grads = _shares(self.kv_pl, self.q_pl)
        lq, lk, lv = (_heads(x, self.head_dim) for x in (q.to_local(), k.to_local(grad_placements=grads),
                                                         v.to_local(grad_placements=grads)))
        start, s = _offset(q, 1), lq.shape[2]
        if self.rotary:
            lq = _rotary(lq, torch.arange(start, start + s), ((start, start + s),))
            lk = _rotary(lk)
        out = causal_attention(lq, lk, lv, self.flash, start)
        b, s_local, width = q.to_local().shape
        local = out.transpose(1, 2).reshape(b, s_local, width)
        return DTensor.from_local(local, self.mesh, self.q_pl, run_check=False, shape=q.shape, stride=q.stride())


def _heads(x, head_dim: int):
    """[b, s, heads x d] -> [b, heads, s, d] (a view)."""
    b, s, width = x.shape
    return x.view(b, s, width // head_dim, head_dim).transpose(1, 2)


class LayoutLoss:
    """The loss operator in its placements: logits [b, s, V] redistributed to them, Megatron's
    vocabulary-parallel cross entropy over the axes that cut v, the per-token losses of the batch and
    sequence shards averaged over the whole micro-batch."""

    def __init__(self, mesh, layout: OperatorLayout):
        self.mesh = mesh
        self.logits_pl = layout.placements("loss", OPERATORS["loss"].inputs[0][1])
        self.targets_pl = layout.placements("loss", BS)
        vocab_axes = [i for i, p in enumerate(self.logits_pl) if isinstance(p, Shard) and p.dim == 2]
        self.token_pl = [Replicate() if i in vocab_axes else p for i, p in enumerate(self.logits_pl)]
        self.group = None
        if len(vocab_axes) == 1:
            self.group = mesh.get_group(vocab_axes[0])
        elif vocab_axes:
            names = tuple(mesh.mesh_dim_names[i] for i in vocab_axes)
            self.group = mesh[names]._flatten("_".join(names)).get_group()

    def __call__(self, logits, targets):
        logits = _to(logits, self.mesh, self.logits_pl)
        targets = _to(targets, self.mesh, self.targets_pl)
        per_token = _VocabParallelCrossEntropy.apply(logits.to_local(), targets.to_local(), self.group,
                                                     _offset(logits, 2))
        tokens = DTensor.from_local(per_token, self.mesh, self.token_pl, run_check=False, shape=targets.shape,
                                    stride=targets.stride())
        return tokens.mean().full_tensor()


def layout_mesh(mesh, layout: OperatorLayout):
    """The tensor-parallel group's mesh of ``layout`` within a run's world mesh (advisor.executor.parallel.build_mesh
    names its axes tp0, tp1, ... when the group's mesh has more than one)."""
    if len(layout.mesh_shape) == 1:
        return mesh["tp"]
    return mesh[tuple(f"tp{i}" for i in range(len(layout.mesh_shape)))]
