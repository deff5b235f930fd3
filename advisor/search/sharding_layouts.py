"""Layouts and redistributions of operator-level sharding (advisor.search.sharding explains them).

The labels of a strategy (REPLICATE) and of a layout (PARTIAL, REPL), one operator under one strategy
(Shard) and its facts (_OpInfo), the collectives turning one layout into another (conversion), and
the batch that prices many collectives in one vectorized call per kind (_Collectives).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from advisor.cost import comm
from advisor.graph.graph import OperatorGraph
from advisor.search.sharding_mesh import DeviceMesh
from advisor.specs.hardware import HardwareProfile

REPLICATE = "*"
PARTIAL = -1
REPL = -2
Strat = tuple  # one label (or REPLICATE; None while undecided) per mesh axis


@dataclass(frozen=True)
class Shard:
    """One operator under one strategy."""

    valid: bool
    out_layouts: tuple[tuple[int, ...], ...] = ()    # per output
    in_layouts: tuple[tuple[int, ...], ...] = ()     # per input: what the operator needs
    in_grads: tuple[tuple[int, ...], ...] = ()       # per input: the layout its gradient comes out in
    local_bytes: tuple[float, ...] = ()              # per tensor of the operator (inputs, outputs, internals)
    local_flops: float = 0.0


@dataclass
class _Collectives:
    """Collectives gathered from many strategies, priced in one vectorized call per kind."""

    rows: int
    items: dict[str, list[tuple[int, int, float, float]]] = field(default_factory=dict)

    def add(self, op: str, row: int, mask: int, nbytes: float, weight: float = 1.0) -> None:
        if mask and nbytes > 0 and weight:
            self.items.setdefault(op, []).append((row, mask, nbytes, weight))

    def total(self, hw: HardwareProfile, mesh: DeviceMesh) -> np.ndarray:
        out = np.zeros(self.rows)
        for op, items in self.items.items():
            rows, masks, nbytes, weights = (np.array(x) for x in zip(*items))
            groups = np.array([mesh.group(int(m)) for m in masks], dtype=np.int64)
            t = comm.collective_time_s(hw, op, nbytes, groups[:, 0], groups[:, 1])
            np.add.at(out, rows.astype(np.int64), np.asarray(t, dtype=float) * weights)
        return out


def conversion(x: tuple[int, ...], y: tuple[int, ...], sizes: tuple[int, ...], full_bytes: float):
    """Collectives turning layout x into layout y of a tensor of full_bytes: [(op, axis mask, bytes)]."""
    out = []
    local = full_bytes / math.prod(s for s, c in zip(sizes, x) if c >= 0)
    ar = rs = a2a = ag = 0
    after = list(x)
    for k, (a, b) in enumerate(zip(x, y)):
        if a == PARTIAL:
            if b >= 0:
                rs |= 1 << k
                after[k] = b
            else:
                ar |= 1 << k
                after[k] = REPL
    if ar:
        out.append(("all_reduce", ar, local))
    if rs:
        out.append(("reduce_scatter", rs, local))
        local /= math.prod(sizes[k] for k in range(len(sizes)) if rs >> k & 1)
    gathered = 1
    for k, (a, b) in enumerate(zip(after, y)):
        if a >= 0 and b != a:
            if b >= 0:
                a2a |= 1 << k
            else:
                ag |= 1 << k
                gathered *= sizes[k]
    if a2a:
        out.append(("all_to_all", a2a, local))
    if ag:
        out.append(("all_gather", ag, local * gathered))
    return out


def _backward_target(x: tuple[int, ...]) -> tuple[int, ...]:
    """The layout a producer needs its output's gradient in: its partial-sum axes replicated."""
    return tuple(REPL if c == PARTIAL else c for c in x)


class _OpInfo:
    def __init__(self, graph: OperatorGraph, index: int, forbid: frozenset[str]):
        op = graph.operators[index]
        self.op = op
        self.index = index
        self.tensors = [graph.tensors[t] for t in op.tensors]
        self.n_in, self.n_out = len(op.inputs), len(op.outputs)
        extents: dict[str, int] = {}
        for t, labs in zip(self.tensors, op.labels):
            for lab, size in zip(labs, t.shape):
                extents[lab] = max(extents.get(lab, 1), size)
        self.choices = tuple(lab for lab in op.all_labels
                             if lab not in op.no_cut and lab not in forbid and extents.get(lab, 1) > 1) + (REPLICATE,)
        self.params = [i for i, t in enumerate(self.tensors[: self.n_in]) if t.param]


def _mask(labels: list[str], pred) -> int:
    out = 0
    for k, lab in enumerate(labels):
        if lab != REPLICATE and pred(lab):
            out |= 1 << k
    return out
