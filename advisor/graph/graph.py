"""The operator graph: tensors with shapes, operators with einsum-style index labels, and links.

Every operator names the index of each dimension of each of its tensors with a *label*, as in
einsum: a matmul ``x[b,s,h] @ w[h,f] -> y[b,s,f]`` has labels b, s, h, f. Cutting a label ``c``
ways cuts every tensor dimension that carries it ``c`` ways, so a sharding strategy of an operator
is a choice of label for each device-mesh axis (advisor.search.sharding). What a cut implies
follows from where the label appears:

* in an output: that output is split (no communication inside the operator);
* only in inputs (contracted) and summed (matmul's inner dimension, an embedding's vocabulary):
  the output holds partial sums, reduced where a consumer needs it (all-reduce or reduce-scatter);
* only in inputs and reduced non-linearly (``stat_labels``: the vocabulary of a softmax cross
  entropy): an all-reduce of ``stat_bytes`` per output element inside the operator (Megatron's
  vocabulary-parallel cross entropy);
* absent from a parameter: the parameter is replicated across that cut and its gradient is reduced
  once per step (data parallelism);
* absent from an activation input: that input is replicated across the cut and its gradient is
  reduced in the backward pass (Megatron's ``f`` operator);
* in ``label_map`` (``{"e": "b"}``): the operator's inputs see the cut on another label, and the
  operator exchanges its output with an all-to-all (MoE token dispatch and combine).

Repeated layers are one *template* whose operators carry ``count`` (the number of layers); a
``Link`` says that one tensor feeds another ``count`` times (layer i's output is layer i+1's
input), so the graph size does not grow with the number of layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from advisor.errors import AdvisorError

GEMM_KINDS = ("matmul", "attention", "conv2d")
MEMORY_KINDS = (
    "embedding", "elementwise", "norm", "batchnorm", "softmax", "loss", "pool2d", "reduce", "concat",
    "reshape", "dispatch", "combine",
)
KINDS = GEMM_KINDS + MEMORY_KINDS


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype_bytes: int
    param: bool = False
    tied_to: str | None = None     # a parameter stored once with another (tied embeddings): memory counted there

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype_bytes


@dataclass(frozen=True)
class Operator:
    """One operator of the graph. ``labels`` gives one label tuple per tensor of ``tensors``
    (inputs, then outputs, then internals: tensors the operator keeps for the backward pass that
    no other operator sees, such as attention scores)."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    internals: tuple[str, ...] = ()
    flops: float = 0.0                   # forward GEMM FLOPs of one execution (2 per multiply-add)
    epilogue_passes: float = 0.0         # fused element-wise passes over the outputs (bias, activation)
    no_cut: frozenset[str] = frozenset()
    stat_labels: frozenset[str] = frozenset()
    stat_bytes: float = 0.0              # all-reduced bytes per output element when a stat label is cut
    label_map: tuple[tuple[str, str], ...] = ()
    saves: tuple[str, ...] = ()          # tensors kept for the backward pass (activation memory)
    count: int = 1                       # executions per micro-batch (layers sharing this template)
    # outputs the operator itself keeps for the backward pass (a fused attention kernel keeps its output):
    # one tensor with a consumer that saves it in the same layout, two where the consumer's layout differs
    # (advisor.search.sharding_problem prices them on the edge to that consumer)
    kept_outputs: tuple[str, ...] = ()

    @property
    def tensors(self) -> tuple[str, ...]:
        return self.inputs + self.outputs + self.internals

    def labels_of(self, tensor: str) -> tuple[str, ...]:
        return self.labels[self.tensors.index(tensor)]

    @cached_property
    def all_labels(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for labs in self.labels:
            for lab in labs:
                seen.setdefault(lab, None)
        for lab, _ in self.label_map:
            seen.setdefault(lab, None)
        return tuple(seen)

    @cached_property
    def output_labels(self) -> frozenset[str]:
        n_in = len(self.inputs)
        return frozenset(lab for labs in self.labels[n_in:n_in + len(self.outputs)] for lab in labs)

    @cached_property
    def sum_labels(self) -> frozenset[str]:
        """Contracted labels whose cut leaves partial sums in the outputs."""
        mapped = {src for src, _ in self.label_map}
        inputs = {lab for labs in self.labels[: len(self.inputs)] for lab in labs}
        return frozenset(inputs - self.output_labels - self.stat_labels - mapped)

    @property
    def is_gemm(self) -> bool:
        return self.kind in GEMM_KINDS

    def input_label(self, label: str) -> str:
        """The label the inputs see for a cut of ``label`` (label_map)."""
        for src, dst in self.label_map:
            if src == label:
                return dst
        return label


@dataclass(frozen=True)
class Link:
    """Tensor ``source`` feeds tensor ``target`` ``count`` times (the next repetition of a template)."""

    source: str
    target: str
    count: int


@dataclass(frozen=True)
class Edge:
    """Data flowing from operator ``src`` (its tensor ``src_tensor``) to operator ``dst`` (its tensor
    ``dst_tensor``), ``count`` times per micro-batch."""

    src: int
    dst: int
    src_tensor: str
    dst_tensor: str
    count: int
    dst_slot: int = 0        # which input of dst (a tensor may feed one operator twice)


@dataclass(frozen=True)
class OperatorGraph:
    name: str
    source: str
    tensors: dict[str, Tensor]
    operators: tuple[Operator, ...]
    links: tuple[Link, ...] = ()
    notes: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_graph(self)

    @cached_property
    def producers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, op in enumerate(self.operators):
            for t in op.outputs:
                out[t] = i
        return out

    @cached_property
    def consumers(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for i, op in enumerate(self.operators):
            for t in op.inputs:
                out.setdefault(t, []).append(i)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        """Producer -> consumer flows: direct ones (as often as both run: the smaller count) and linked
        ones (a link's count). Parameters and graph inputs have no producer and cost nothing to lay out."""
        out = []
        for j, op in enumerate(self.operators):
            for slot, t in enumerate(op.inputs):
                i = self.producers.get(t)
                if i is not None:
                    out.append(Edge(i, j, t, t, min(self.operators[i].count, op.count), slot))
        for link in self.links:
            i = self.producers[link.source]
            for j in dict.fromkeys(self.consumers.get(link.target, ())):
                for slot, t in enumerate(self.operators[j].inputs):
                    if t == link.target:
                        out.append(Edge(i, j, link.source, link.target, link.count, slot))
        return tuple(out)

    def param_owner(self) -> dict[str, int]:
        """Parameter -> the operator whose strategy decides its layout in memory (its first consumer)."""
        owner: dict[str, int] = {}
        for i, op in enumerate(self.operators):
            for t in op.inputs:
                if self.tensors[t].param and t not in owner:
                    owner[t] = i
        return owner

    @property
    def num_params(self) -> int:
        """Parameters, every repetition counted once, tied copies not counted."""
        counts: dict[str, int] = {}
        for op in self.operators:
            for t in op.inputs:
                tensor = self.tensors[t]
                if tensor.param and tensor.tied_to is None:
                    counts[t] = max(counts.get(t, 0), op.count)
        return sum(self.tensors[t].numel * c for t, c in counts.items())


def check_graph(g: OperatorGraph) -> None:
    """Structural checks; a graph built from a user's file has already been checked with file and key
    names (advisor.graph.loader), so these only guard builders."""
    names = set()
    produced: set[str] = set()
    for op in g.operators:
        where = f"graph {g.name}: operator '{op.name}'"
        if op.name in names:
            raise AdvisorError(f"{where}: the name is used twice")
        names.add(op.name)
        if op.kind not in KINDS:
            raise AdvisorError(f"{where}: unknown kind '{op.kind}' (known: {', '.join(KINDS)})")
        if len(op.labels) != len(op.tensors):
            raise AdvisorError(f"{where}: {len(op.labels)} label tuples for {len(op.tensors)} tensors")
        if op.count < 1:
            raise AdvisorError(f"{where}: count must be positive, got {op.count}")
        extents: dict[str, int] = {}
        for t, labs in zip(op.tensors, op.labels):
            if t not in g.tensors:
                raise AdvisorError(f"{where}: unknown tensor '{t}'")
            shape = g.tensors[t].shape
            if len(labs) != len(shape):
                raise AdvisorError(f"{where}: tensor '{t}' has shape {list(shape)} but labels {''.join(labs)!r}")
            for lab, size in zip(labs, shape):
                if lab in op.no_cut:
                    continue
                if extents.setdefault(lab, size) != size:
                    raise AdvisorError(
                        f"{where}: label '{lab}' has size {extents[lab]} in one tensor and {size} in '{t}'")
        for t in op.outputs:
            if t in produced:
                raise AdvisorError(f"{where}: tensor '{t}' is produced twice")
            if g.tensors[t].param:
                raise AdvisorError(f"{where}: output '{t}' is a parameter")
            produced.add(t)
        for t in op.saves:
            if t not in op.tensors:
                raise AdvisorError(f"{where}: saves '{t}', which is not one of its tensors")
    for link in g.links:
        for t in (link.source, link.target):
            if t not in g.tensors:
                raise AdvisorError(f"graph {g.name}: link names unknown tensor '{t}'")
        if link.source not in produced:
            raise AdvisorError(f"graph {g.name}: link source '{link.source}' is not produced by any operator")
        if g.tensors[link.source].shape != g.tensors[link.target].shape:
            raise AdvisorError(
                f"graph {g.name}: link '{link.source}' -> '{link.target}' joins shapes "
                f"{list(g.tensors[link.source].shape)} and {list(g.tensors[link.target].shape)}")
        if link.count < 1:
            raise AdvisorError(f"graph {g.name}: link '{link.source}' -> '{link.target}' count must be positive")
