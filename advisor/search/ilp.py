"""The operator sharding problem as an integer linear program, solved with OR-Tools CP-SAT.

Alpa (Zheng et al., OSDI 2022, section 4.2) chooses each operator's sharding with an ILP: one-hot
strategy variables per operator, resharding costs on the edges linearized with pair variables, a
memory constraint. This module builds that program over the space and costs of
advisor.search.sharding (the same ones D-Rec searches), so its optimum is exact for that model.

Formulation (the code follows the numbers):

1. Strategies. For each operator v (repeated layers are one template: one set of variables stands
   for all its layers, its costs multiplied by the layer count, so the program does not grow with
   depth), the legal strategies S_v. Two are merged when they present the same layouts on every
   edge of v and one is no cheaper and no leaner (dominance; exact). With an incumbent of cost U
   (the D-Rec answer, when it fits), a strategy is dropped when its cost plus the cheapest cost of
   every other operator exceeds U (it cannot be in a better solution; exact).
2. Variables x[v,s] in {0,1}, with sum_s x[v,s] = 1 for every v.
3. Edges. For edge e from u to w, the producer's strategies fall into classes a by the layout they
   give the tensor, the consumer's into classes b by the layout they need (and the layout of the
   gradient they return). Pair variables y[e,a,b] in {0,1} with
       sum_b y[e,a,b] = sum_{s in a} x[u,s]     and     sum_a y[e,a,b] = sum_{s in b} x[w,s],
   so y[e,a,b] = 1 exactly when u's layout is a and w's is b (the marginal, or "local polytope",
   linearization of the product x[u,.] x[w,.]; tight on trees). An edge whose producer or consumer
   has one class adds its cost to the other side's x instead; an edge from an operator to itself
   (a one-operator template feeding its next repetition) adds to that operator's x.
4. Memory. sum_{v,s} mem[v,s] x[v,s] + sum mem[e,a,b] y[e,a,b] <= M: parameters, gradients,
   optimizer states and saved activations per device, and on the edge of a kept output (a fused
   attention's own copy of its output, ShardingProblem.edge_memory) the producer's copy where the
   consumer saves another layout (folded into one side's x like a cost); in integer units of a
   millionth of the limit (the rounding stays within the 1e-4 tolerance with which every searcher
   compares memory to the limit).
5. Objective. minimize sum c[v,s] x[v,s] + sum c[e,a,b] y[e,a,b]: compute + in-operator
   communication + gradient reduction + redistribution, seconds per step scaled to integers
   (the incumbent's cost = 1e8 units).
6. Solve. CP-SAT with a time limit, the D-Rec solution as a hint (warm start), and as many workers
   as cores (at most 8).
7. Report. The solver status (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN), the objective, its proven
   lower bound and the relative gap, always; the solution re-priced in floating point. INFEASIBLE
   (nothing fits in memory) comes with what would fit: more devices, more memory, pipeline stages.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from advisor.cost.memory import GIB
from advisor.errors import AdvisorError, InfeasibleError
from advisor.search.drec import drec_search
from advisor.search.sharding import (
    MEMORY_TOLERANCE, OperatorSolution, ShardingProblem, Strat, memory_fix_message, solution,
)

OBJECTIVE_UNITS = 1e8      # integer units for the incumbent's cost
MEMORY_UNITS = 1e6         # integer units for the memory limit (CP-SAT's presolve errs with 1e9-sized coefficients)
BACKENDS = ("cp-sat", "scip")


@dataclass(frozen=True)
class IlpResult:
    status: str                          # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID
    solution: OperatorSolution | None    # with UNKNOWN, the warm start when there was one
    objective_s: float | None            # the solver's objective, seconds per step
    bound_s: float | None                # proven lower bound, seconds per step
    gap: float | None                    # (objective - bound) / objective
    seconds: float
    message: str = ""
    stats: dict = field(default_factory=dict)

    def require(self) -> OperatorSolution:
        """The solution, or InfeasibleError with the fix-it message."""
        if self.solution is None:
            raise InfeasibleError(self.message or f"the ILP found no solution (status {self.status})")
        return self.solution


def ilp_search(problem: ShardingProblem, time_limit_s: float = 30.0, warm_start: OperatorSolution | bool = True,
               workers: int | None = None, backend: str = "cp-sat") -> IlpResult:
    """Solve the sharding ILP within ``time_limit_s`` (everything included). ``warm_start``: a
    solution to start from, True to run D-Rec first, or False. ``backend``: "cp-sat", or "scip" (OR-Tools'
    MIP solver, with the pair variables continuous: integral x forces them)."""
    start = time.perf_counter()
    if backend not in BACKENDS:
        raise AdvisorError(f"ILP backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not problem.fits(problem.min_memory_bytes()):
        return IlpResult("INFEASIBLE", None, None, None, None, time.perf_counter() - start, memory_fix_message(problem))
    if warm_start is True:
        warm_start = drec_search(problem)
    hint = warm_start if isinstance(warm_start, OperatorSolution) and warm_start.fits else None
    program, cands = build_program(problem, hint)
    build_s = time.perf_counter() - start
    remaining = max(1.0, float(time_limit_s) - build_s)
    threads = workers or _default_workers()
    solve = _solve_cpsat if backend == "cp-sat" else _solve_mip
    status, chosen, objective, bound = solve(program, backend, remaining, threads)
    stats = {"backend": backend, "operators": problem.num_ops, "strategies": sum(len(c) for c in cands),
             "pair_variables": program.n_vars - program.n_x, "build_seconds": build_s,
             "space_size": problem.space_size(), "warm_start_cost_s": hint.cost_s if hint else None}
    # 7. report
    if chosen is None:
        if status == "INFEASIBLE":
            return IlpResult(status, None, None, None, None, time.perf_counter() - start, memory_fix_message(problem), stats)
        msg = f"the solver found no solution within {time_limit_s:g} s (status {status}); allow more time"
        if hint is None:
            return IlpResult(status, None, None, bound, None, time.perf_counter() - start, msg, stats)
        # the warm start stands: it is the best solution known, with the solver's bound
        chosen = [c.index(hint.assignment[v]) for v, c in enumerate(cands)]
        objective, bound = hint.cost_s, max(bound or 0.0, 0.0)
        msg = f"the solver did not improve on the warm start within {time_limit_s:g} s (status {status})"
    else:
        msg = ""
    assignment = [cands[v][i] for v, i in enumerate(chosen)]
    bound = min(bound, objective)
    gap = max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
    seconds = time.perf_counter() - start
    sol = solution(problem, "ilp", assignment, seconds, status=status, gap=gap, backend=backend)
    return IlpResult(status, sol, objective, bound, gap, seconds, msg, stats)


def _default_workers() -> int:
    """CP-SAT's parallel portfolio needs cores: on two or fewer, one LP-guided worker does best
    (measured on the GPT-3 benchmark instances); otherwise up to 8."""
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(8, cores)


@dataclass
class Program:
    """The ILP, solver-neutral: variables 0..n_x-1 are the strategy choices x (one-hot per
    operator in ``groups``), the rest the pair variables y. Seconds and bytes in floats."""

    n_x: int
    groups: list[list[int]]
    cost_s: list[float] = field(default_factory=list)               # per variable
    equalities: list[tuple[list[int], list[int]]] = field(default_factory=list)   # sum(y) == sum(x)
    memory_vars: list[int] = field(default_factory=list)
    memory_bytes: list[float] = field(default_factory=list)
    memory_limit_bytes: float = 0.0
    hint: list[int] | None = None                                     # a value per variable
    upper_s: float | None = None

    @property
    def n_vars(self) -> int:
        return len(self.cost_s)


def build_program(problem: ShardingProblem, hint: OperatorSolution | None) -> tuple[Program, list[list[Strat]]]:
    """Steps 1-5 of the formulation."""
    upper = hint.cost_s if hint is not None else None
    # 1. strategies: dominance-merged, then bounded by the incumbent
    cands = _candidates(problem, hint)
    op_cost, edges = _edges(problem, cands)
    if upper is not None:
        cands = _bound(problem, cands, op_cost, edges, upper, hint)
        op_cost, edges = _edges(problem, cands)
    # 2. one-hot strategy variables
    groups, n = [], 0
    for c in cands:
        groups.append(list(range(n, n + len(c))))
        n += len(c)
    prog = Program(n_x=n, groups=groups, memory_limit_bytes=problem.memory_limit_bytes, upper_s=upper)
    chosen = [c.index(hint.assignment[v]) for v, c in enumerate(cands)] if hint else None
    y_cost, y_hint = [], []
    # 3. edges: fold one-class sides into operator costs (and memory), pair variables for the rest
    floor = sum(float(c.min()) for c in op_cost)
    op_mem = [problem.op_costs(v, cands[v])[1] for v in range(problem.num_ops)]
    for ed in edges:
        if ed.mat.shape[1] == 1:
            op_cost[ed.u] = op_cost[ed.u] + ed.mat[ed.a_of, 0]
            op_mem[ed.u] = op_mem[ed.u] + ed.mem[ed.a_of, 0]
            continue
        if ed.mat.shape[0] == 1:
            op_cost[ed.w] = op_cost[ed.w] + ed.mat[0, ed.b_of]
            op_mem[ed.w] = op_mem[ed.w] + ed.mem[0, ed.b_of]
            continue
        a_hint = int(ed.a_of[chosen[ed.u]]) if hint else -1
        b_hint = int(ed.b_of[chosen[ed.w]]) if hint else -1
        rows = [[] for _ in range(ed.mat.shape[0])]
        cols = [[] for _ in range(ed.mat.shape[1])]
        for a, b in zip(*np.nonzero(_pair_allowed(ed, op_cost, floor, upper))):
            var = n + len(y_cost)
            rows[a].append(var)
            cols[b].append(var)
            y_cost.append(float(ed.mat[a, b]))
            y_hint.append(int(a == a_hint and b == b_hint))
            if ed.mem[a, b] > 0:
                prog.memory_vars.append(var)
                prog.memory_bytes.append(float(ed.mem[a, b]))
        for a, row in enumerate(rows):
            prog.equalities.append((row, [groups[ed.u][i] for i in np.flatnonzero(ed.a_of == a)]))
        for b, col in enumerate(cols):
            prog.equalities.append((col, [groups[ed.w][j] for j in np.flatnonzero(ed.b_of == b)]))
    # 4. memory
    for v in range(problem.num_ops):
        for var, mb in zip(groups[v], op_mem[v]):
            if mb > 0:
                prog.memory_vars.append(var)
                prog.memory_bytes.append(float(mb))
    # 5. objective
    prog.cost_s = [float(c) for v in range(problem.num_ops) for c in op_cost[v]] + y_cost
    if hint:
        prog.hint = [int(i == chosen[v]) for v in range(problem.num_ops) for i in range(len(cands[v]))] + y_hint
    return prog, cands


def _solve_cpsat(prog: Program, backend: str, seconds: float, threads: int):
    """6. CP-SAT: every variable Boolean, costs in integer units (the incumbent = 1e8), memory in
    units of limit / 1e6 bytes, rounded up, with the limit raised by the 1e-4 tolerance of
    ShardingProblem.fits (100 units: more than the rounding of a warm start of up to 100
    operators)."""
    from ortools.sat.python import cp_model     # imported where a layout is solved: 0.4 s off every other command

    scale = OBJECTIVE_UNITS / max(prog.upper_s or sum(prog.cost_s), 1e-12)
    model = cp_model.CpModel()
    var = [model.new_bool_var(f"v{i}") for i in range(prog.n_vars)]
    for group in prog.groups:
        model.add_exactly_one(var[i] for i in group)
    for ys, xs in prog.equalities:
        model.add(sum(var[i] for i in ys) == sum(var[i] for i in xs))
    unit = max(prog.memory_limit_bytes, 1.0) / MEMORY_UNITS
    model.add(cp_model.LinearExpr.weighted_sum([var[i] for i in prog.memory_vars],
                                               [int(np.ceil(b / unit)) for b in prog.memory_bytes])
              <= int(prog.memory_limit_bytes // unit) + int(prog.memory_limit_bytes * MEMORY_TOLERANCE // unit))
    # A term dearer than the incumbent cannot be in a better solution: capping it keeps the optimum
    # and keeps the coefficients (and CP-SAT's LP relaxation) well scaled.
    cap = OBJECTIVE_UNITS + 1 if prog.upper_s else None
    terms = [(var[i], min(int(round(c * scale)), cap or int(round(c * scale)))) for i, c in enumerate(prog.cost_s) if c > 0]
    model.minimize(cp_model.LinearExpr.weighted_sum([t[0] for t in terms], [t[1] for t in terms]))
    if prog.hint is not None:
        for v, h in zip(var, prog.hint):
            model.add_hint(v, bool(h))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = threads
    solver.parameters.linearization_level = 2      # the marginal equalities make a tight LP: use it fully
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.best_objective_bound / scale if status != cp_model.INFEASIBLE else None
        return name, None, None, bound
    chosen = [next(k for k, i in enumerate(g) if solver.boolean_value(var[i])) for g in prog.groups]
    return name, chosen, solver.objective_value / scale, solver.best_objective_bound / scale


def _solve_mip(prog: Program, backend: str, seconds: float, threads: int):
    """6. SCIP through pywraplp: x binary, y continuous in [0, 1], costs scaled so the
    incumbent is 1000, memory in GiB (the solver's feasibility tolerance, 1e-6, is within ours)."""
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver(backend.upper())
    if solver is None:
        raise AdvisorError(f"OR-Tools was built without the {backend} solver; use backend cp-sat")
    scale = 1e3 / max(prog.upper_s or sum(prog.cost_s), 1e-12)
    var = [solver.BoolVar(f"x{i}") if i < prog.n_x else solver.NumVar(0.0, 1.0, f"y{i}") for i in range(prog.n_vars)]
    for group in prog.groups:
        ct = solver.Constraint(1.0, 1.0)
        for i in group:
            ct.SetCoefficient(var[i], 1.0)
    for ys, xs in prog.equalities:
        ct = solver.Constraint(0.0, 0.0)
        for i in ys:
            ct.SetCoefficient(var[i], 1.0)
        for i in xs:
            ct.SetCoefficient(var[i], -1.0)
    ct = solver.Constraint(-solver.infinity(), prog.memory_limit_bytes / GIB)
    for i, b in zip(prog.memory_vars, prog.memory_bytes):
        ct.SetCoefficient(var[i], b / GIB)
    obj = solver.Objective()
    for i, c in enumerate(prog.cost_s):
        if c > 0:
            obj.SetCoefficient(var[i], c * scale)
    obj.SetMinimization()
    if prog.hint is not None:
        solver.SetHint(var, [float(h) for h in prog.hint])
    solver.SetTimeLimit(int(seconds * 1000))
    solver.SetNumThreads(threads)
    status = solver.Solve()
    names = {pywraplp.Solver.OPTIMAL: "OPTIMAL", pywraplp.Solver.FEASIBLE: "FEASIBLE",
             pywraplp.Solver.INFEASIBLE: "INFEASIBLE", pywraplp.Solver.NOT_SOLVED: "UNKNOWN"}
    name = names.get(status, "UNKNOWN")
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return name, None, None, None
    chosen = [max(range(len(g)), key=lambda k: var[g[k]].solution_value()) for g in prog.groups]
    return name, chosen, obj.Value() / scale, obj.BestBound() / scale


@dataclass(frozen=True)
class _EdgeData:
    e: int
    u: int
    w: int
    a_of: np.ndarray      # producer candidate -> layout class
    b_of: np.ndarray      # consumer candidate -> layout class
    mat: np.ndarray       # seconds per step, classes x classes
    mem: np.ndarray       # bytes per device, classes x classes (ShardingProblem.edge_key_memory)


def _edges(problem: ShardingProblem, cands: list[list[Strat]]) -> tuple[list[np.ndarray], list[_EdgeData]]:
    """Operator costs (self-edges folded in) and the layout classes and cost matrix of every other edge."""
    op_cost = [problem.op_costs(v, cands[v])[0].copy() for v in range(problem.num_ops)]
    out = []
    for e, edge in enumerate(problem.edges):
        u, w = edge.src, edge.dst
        if u == w:
            op_cost[u] += np.diag(problem.edge_costs(e, cands[u], cands[u]))
            continue
        pk = [problem.producer_key(e, s) for s in cands[u]]
        ck = [problem.consumer_key(e, s) for s in cands[w]]
        a_keys, b_keys = list(dict.fromkeys(pk)), list(dict.fromkeys(ck))
        a_index = {k: i for i, k in enumerate(a_keys)}
        b_index = {k: i for i, k in enumerate(b_keys)}
        out.append(_EdgeData(e, u, w, np.array([a_index[k] for k in pk]), np.array([b_index[k] for k in ck]),
                             problem.edge_key_costs(e, a_keys, b_keys), problem.edge_key_memory(e, a_keys, b_keys)))
    return op_cost, out


def _bound(problem: ShardingProblem, cands, op_cost, edges: list[_EdgeData], upper: float,
           hint: OperatorSolution) -> list[list[Strat]]:
    """Drop strategies whose cost, plus their cheapest edges, plus the cheapest cost of every other
    operator, exceeds the incumbent (step 1; exact: such a strategy is in no better solution)."""
    floor = sum(float(c.min()) for c in op_cost)
    lower = [c + floor - float(c.min()) for c in op_cost]
    for ed in edges:
        lower[ed.u] = lower[ed.u] + ed.mat.min(axis=1)[ed.a_of]
        lower[ed.w] = lower[ed.w] + ed.mat.min(axis=0)[ed.b_of]
    limit = upper * (1 + 1e-9)
    return [[s for s, lb in zip(cands[v], lower[v]) if lb <= limit or s == hint.assignment[v]]
            for v in range(problem.num_ops)]


def _pair_allowed(ed: _EdgeData, op_cost, floor: float, upper: float | None) -> np.ndarray:
    """Pairs of layout classes that can be in a solution cheaper than the incumbent."""
    if upper is None:
        return np.ones(ed.mat.shape, dtype=bool)
    cu = np.full(ed.mat.shape[0], np.inf)
    np.minimum.at(cu, ed.a_of, op_cost[ed.u])
    cw = np.full(ed.mat.shape[1], np.inf)
    np.minimum.at(cw, ed.b_of, op_cost[ed.w])
    rest = floor - float(op_cost[ed.u].min()) - float(op_cost[ed.w].min())
    return ed.mat + cu[:, None] + cw[None, :] + rest <= upper * (1 + 1e-9)


def _candidates(problem: ShardingProblem, hint: OperatorSolution | None) -> list[list[Strat]]:
    """Step 1: legal strategies; of those with the same layouts on every edge, the Pareto front of
    (cost, memory). The warm start's strategies are always kept."""
    out = []
    for v in range(problem.num_ops):
        strats = problem.strategies(v)
        cost, mem = problem.op_costs(v, strats)
        keys = [_signature(problem, v, s) for s in strats]
        must = hint.assignment[v] if hint is not None else None
        best: dict[tuple, list[int]] = {}
        for i in np.argsort(cost, kind="stable"):
            kept = best.setdefault(keys[i], [])
            if all(mem[i] < mem[j] for j in kept) or strats[i] == must:
                kept.append(int(i))
        out.append([strats[i] for i in sorted(i for group in best.values() for i in group)])
    return out


def _signature(problem: ShardingProblem, v: int, s: Strat) -> tuple:
    keys = []
    for e in problem.incident[v]:
        edge = problem.edges[e]
        if edge.src == v:
            keys.append(problem.producer_key(e, s))
        if edge.dst == v:
            keys.append(problem.consumer_key(e, s))
        if edge.src == edge.dst == v:
            keys.append(s)
    return tuple(keys)
