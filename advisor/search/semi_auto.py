"""Semi-automatic parallelism: operator strategies a user fixes, checked against the operator graph
and laid onto the device mesh, so that D-Rec and the ILP keep them and choose only the others.

MindSpore's semi-automatic mode takes ``shard()`` strategies for some operators and, with
``sharding_propagation``, derives the others' layouts from them, minimizing redistribution (MindSpore
docs, features/parallel/auto_parallel.rst in mindspore-ai/docs: "sharding strategy propagation
algorithm"). Here the fixed operators' strategy sets are narrowed to the mesh strategies whose input
cuts equal the user's (advisor.search.sharding: ShardingProblem.fixed), and the searchers minimize the
same cost as without them (compute, in-operator collectives, gradient reduction and the forward and
backward redistribution at every layout change), which is that propagation with a global objective.

A strategy's cuts are read per input tensor in advisor's graph form (advisor.graph.transformer: names,
input order and dimensions). A cut of a dimension is a cut of its *label* (einsum-style,
advisor.graph.graph), so a label shared by two inputs must be cut alike (MindSpore refuses a MatMul
whose contracted dimensions are cut differently, for the same reason). The cuts of an operator span
the product of its labels' cuts; that must divide the tensor-parallel group (the rest of the group
repeats the operator, MindSpore's "repeated calculation"), and the layouts are found on the group's
finest mesh (one axis per prime factor, DeviceMesh.for_devices(fine=True)), where every such product
is a set of axes.
"""

from __future__ import annotations

import itertools
import math

from advisor.errors import AdvisorError
from advisor.graph.graph import Operator, OperatorGraph
from advisor.search.sharding import REPLICATE, ShardingProblem, Strat
from advisor.specs.operator_strategies import OperatorStrategies

NAMES_SHOWN = 8


def _dims(graph: OperatorGraph, op: Operator) -> str:
    return ", ".join(f"{t} [{','.join(op.labels_of(t))}]" for t in op.inputs)


def check_strategies(graph: OperatorGraph, fixed: OperatorStrategies, group_devices: int,
                     where: str, exact_group: bool = True) -> dict[int, dict[str, int]]:
    """Operator index -> label -> cut, for every fixed operator of ``graph``; AdvisorError (one
    sentence naming the operator, input and dimension) when a strategy cannot hold there.
    ``group_devices``: the tensor-parallel group the cuts must fit in (``exact_group``: and divide)."""
    index = {op.name: v for v, op in enumerate(graph.operators)}
    origin = fixed.source
    out: dict[int, dict[str, int]] = {}
    for name, cuts in fixed.cuts:
        v = index.get(name)
        if v is None:
            known = [op.name for op in graph.operators]
            raise AdvisorError(f"{origin}: operator {name[:60]!r} is not in the operator graph {graph.name} ({where}); "
                               f"its operators are {', '.join(known[:NAMES_SHOWN])}"
                               + (f" ... ({len(known)} in all)" if len(known) > NAMES_SHOWN else ""))
        op = graph.operators[v]
        at = f"{origin}: operator '{name}'"
        if len(cuts) != len(op.inputs):
            raise AdvisorError(f"{at} takes {len(op.inputs)} inputs ({_dims(graph, op)}), the file gives "
                               f"{len(cuts)}")
        labels: dict[str, tuple[int, int, int]] = {}     # label -> (cut, input, dimension) where first seen
        for i, (t, dims) in enumerate(zip(op.inputs, cuts)):
            shape, labs = graph.tensors[t].shape, op.labels_of(t)
            if len(dims) != len(shape):
                raise AdvisorError(f"{at}, input {i} ({t}, shape {list(shape)}) has {len(shape)} dimensions, the "
                                   f"file gives {len(dims)} cuts")
            used = math.prod(dims)
            if used > group_devices:
                raise AdvisorError(f"{at}, input {i} ({t}): cuts {list(dims)} use {used} devices, more than the "
                                   f"{group_devices} of the tensor-parallel group of {where}")
            for d, (cut, size, lab) in enumerate(zip(dims, shape, labs)):
                if size % cut:
                    raise AdvisorError(f"{at}, input {i} ({t}), dimension {d} ('{lab}', size {size}): cut {cut} "
                                       f"does not divide it")
                if cut > 1 and lab in op.no_cut:
                    raise AdvisorError(f"{at}, input {i} ({t}), dimension {d} ('{lab}', size {size}): a {op.kind} "
                                       f"operator is not cut along this dimension (advisor.graph.transformer)")
                seen = labels.setdefault(lab, (cut, i, d))
                if seen[0] != cut:
                    raise AdvisorError(f"{at}: dimension {seen[2]} of input {seen[1]} and dimension {d} of input {i} "
                                       f"are the same axis ('{lab}') but are cut {seen[0]} and {cut} ways; shared "
                                       f"dimensions must be cut alike")
        label_cuts = {lab: c for lab, (c, _, _) in labels.items() if c > 1}
        total = math.prod(label_cuts.values())
        if total > group_devices or (exact_group and group_devices % total):
            raise AdvisorError(f"{at}: its cuts span {total} devices ({' x '.join(f'{lab}{c}' for lab, c in label_cuts.items())}), "
                               f"which {'is more than' if total > group_devices else 'does not divide'} the "
                               f"{group_devices} devices of the tensor-parallel group of {where}")
        out[v] = label_cuts
    return out


def required_group(graph: OperatorGraph, fixed: OperatorStrategies, devices: int) -> int:
    """The smallest tensor-parallel group that can hold every fixed operator (the lcm of their spans),
    after checking the strategies against a graph whose configuration-dependent dimensions are at
    their largest (``devices``: the most a group can have)."""
    spans = check_strategies(graph, fixed, devices, f"{graph.name} on {devices} devices", exact_group=False)
    group = 1
    for label_cuts in spans.values():
        group = math.lcm(group, math.prod(label_cuts.values()))
    return group


def input_cuts(problem: ShardingProblem, v: int, strat: Strat) -> tuple[tuple[int, ...], ...]:
    """The shard() form of a mesh strategy: per input of operator v, the cut of each dimension."""
    op = problem.info[v].op
    sizes = problem.mesh.shape
    seen = [op.input_label(REPLICATE if lab is None else lab) for lab in strat]
    return tuple(tuple(math.prod(size for size, lab in zip(sizes, seen) if lab == dim) for dim in op.labels_of(t))
                 for t in op.inputs)


def matching_strategies(problem: ShardingProblem, v: int, cuts: tuple[tuple[int, ...], ...]) -> list[Strat]:
    """The mesh strategies of operator v whose input cuts are ``cuts`` (several when axes can be
    permuted or a label maps onto another, as MoE dispatch does)."""
    op = problem.info[v].op
    wanted = {lab for t, dims in zip(op.inputs, cuts) for lab, c in zip(op.labels_of(t), dims) if c > 1}
    labels = [lab for lab in problem.choices(v) if lab != REPLICATE and op.input_label(lab) in wanted]
    out = []
    for strat in itertools.product(labels + [REPLICATE], repeat=len(problem.mesh.shape)):
        if input_cuts(problem, v, strat) == cuts and problem.shard(v, strat).valid:
            out.append(strat)
    return out


def fix_strategies(problem: ShardingProblem, fixed: OperatorStrategies) -> None:
    """Narrow the fixed operators of the problem to their user-given strategies (AdvisorError when
    one cannot be laid out on the problem's mesh)."""
    wanted = fixed.as_dict()
    for v, info in enumerate(problem.info):
        cuts = wanted.get(info.op.name)
        if cuts is None:
            continue
        found = matching_strategies(problem, v, cuts)
        if not found:
            raise AdvisorError(f"{fixed.source}: operator '{info.op.name}' cuts {[list(c) for c in cuts]} cannot be laid "
                               f"out on the {problem.mesh.describe()} mesh of its tensor-parallel group")
        problem.fix(v, found)


def strategies_record(problem: ShardingProblem, assignment) -> dict[str, list[list[int]]]:
    """Operator name -> cuts per input (the --operator-strategies form) of a whole assignment."""
    return {info.op.name: [list(c) for c in input_cuts(problem, v, s)]
            for v, (info, s) in enumerate(zip(problem.info, assignment))}


__all__ = ["check_strategies", "required_group", "input_cuts", "matching_strategies", "fix_strategies",
           "strategies_record"]
