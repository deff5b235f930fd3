"""D-Rec: the double-recursive operator sharding search of MindSpore's auto-parallel mode, generalized.

MindSpore (``auto_parallel_search_mode="recursive_programming"``; Wang et al., "Efficient and
Systematic Partitioning of Large and Deep Neural Networks for Parallelization", Euro-Par 2021)
recursively halves the device set; at each level it visits the operators in order and gives each
the cut (one tensor dimension, i.e. one label here) that costs least given the cuts already decided
for its neighbours, and element-wise operators take over their neighbours' layouts through the same
rule. The two recursions are over the device hierarchy (levels) and over the graph (operators).

Generalized here:

1. the levels are the axes of any ``DeviceMesh``, outermost (slowest links) first: prime factors
   (``DeviceMesh.for_devices(..., fine=True)``: 2, 3, 5, ... not only powers of two) or coarser
   axes, and any number of devices (no 1,024 limit);
2. the cost of a choice is the full cost model of advisor.search.sharding (compute at the local
   size, the in-operator collectives, gradient reduction, and forward plus backward redistribution
   against each neighbour) with the axes not yet decided treated as replicated;
3. memory: when the recursive answer does not fit, the recursion is rerun with memory weighed in
   (seconds per byte, raised until the answer fits, then narrowed by bisection); if nothing fits
   that way, a repair pass moves operators to leaner strategies, cheapest seconds per byte first;
4. the recursion runs once per assumption about neighbours that have not chosen the current
   level's cut yet (replicated, adaptive, or answering with their best label) and keeps the best;
5. a polishing pass (coordinate descent) then lets each operator change its strategy given all its
   neighbours, while the total memory still fits, and pairs a move that would overflow memory with
   the cheapest move elsewhere that frees enough; every move lowers the cost.

The result is a point of the same space the ILP searches, so it is never cheaper than the ILP's
optimum (tests/test_drec.py checks this against brute force and the ILP).
"""

from __future__ import annotations

import math
import time

import numpy as np

from advisor.search.sharding import MEMORY_TOLERANCE, OperatorSolution, ShardingProblem, Strat, solution

FULL_NEIGHBOURHOOD = 512     # operators with at most this many strategies try all of them when polishing
POLISH_ROUNDS = 20
WEIGHT_TRIES = 8              # memory weights tried (x8 each) before falling back to repair
WEIGHT_BISECTIONS = 3
SWAP_GAINS = 8               # memory-blocked gains tried per swap round
ASSUMPTIONS = ("replicated", "adaptive", "lookahead")


def drec_search(problem: ShardingProblem, order: str = "graph", polish: bool = True,
                assumptions: tuple[str, ...] = ASSUMPTIONS) -> OperatorSolution:
    """The recursion once per assumption about the neighbours that have not chosen the current
    level's cut yet (see _local_costs), each followed by memory repair and polishing; the cheapest
    answer that fits wins. ``order`` = "graph" visits operators in graph order, "cost" the most expensive first."""
    start = time.perf_counter()
    visit = _order(problem, order)
    best, report = None, {}
    for assumption in assumptions:
        current, runs = _recursion(problem, visit, assumption)
        moves = {"level_runs": runs, "repair_moves": 0, "polish_moves": 0}
        if not problem.evaluate(current).fits:
            moves["repair_moves"] = _repair(problem, current)
        if polish:
            moves["polish_moves"] = _polish(problem, current)
        ev = problem.evaluate(current)
        report[assumption] = {"cost_s": ev.cost_s, "fits": ev.fits, **moves}
        if best is None or (ev.fits, -ev.cost_s) > (best[0].fits, -best[0].cost_s):
            best = (ev, current, assumption)
    return solution(problem, "drec", best[1], time.perf_counter() - start, order=order, assumption=best[2],
                    runs=report)


def _recursion(problem: ShardingProblem, visit: list[int], assumption: str) -> tuple[list[Strat], int]:
    current = _levels(problem, visit, 0.0, assumption)
    if problem.evaluate(current).fits:
        return current, 1
    return _memory_weighted_levels(problem, visit, current, assumption)


def _levels(problem: ShardingProblem, visit: list[int], weight: float, assumption: str = "replicated") -> list[Strat]:
    """The double recursion: mesh axes outermost first, operators in order, each taking the label
    that costs least (seconds + weight x bytes per device) against its neighbours as decided so far.
    Memory of a partial strategy is scaled by the axes still undecided (as if they cut evenly)."""
    n_axes = len(problem.mesh.shape)
    current: list[Strat] = [(None,) * n_axes for _ in range(problem.num_ops)]
    for level in range(n_axes):
        undecided = math.prod(problem.mesh.shape[level + 1:])
        for v in visit:
            cands = _level_candidates(problem, v, current[v], level)
            cost = _local_costs(problem, v, cands, current, level, assumption)
            if weight:
                cost = cost + weight * problem.op_costs(v, cands)[1] / undecided
            current[v] = cands[int(np.argmin(cost))]
    return current


def _memory_weighted_levels(problem: ShardingProblem, visit: list[int], plain: list[Strat],
                            assumption: str) -> tuple[list[Strat], int]:
    """When the plain recursion does not fit: weigh memory (seconds per byte) until it does, then
    narrow the weight down by bisection, keeping the cheapest answer that fits."""
    ev = problem.evaluate(plain)
    weight = 1e-3 * ev.cost_s / problem.memory_limit_bytes
    low, best, runs = 0.0, None, 1
    for _ in range(WEIGHT_TRIES):
        cand = _levels(problem, visit, weight, assumption)
        runs += 1
        ev = problem.evaluate(cand)
        if ev.fits:
            best = (ev.cost_s, cand)
            break
        low, weight = weight, weight * 8.0
    if best is None:
        return plain, runs
    high = weight
    for _ in range(WEIGHT_BISECTIONS):
        mid = math.sqrt(max(low, high / 64.0) * high)
        cand = _levels(problem, visit, mid, assumption)
        runs += 1
        ev = problem.evaluate(cand)
        if ev.fits:
            high = mid
            if ev.cost_s < best[0]:
                best = (ev.cost_s, cand)
        else:
            low = mid
    return best[1], runs


def _level_candidates(problem: ShardingProblem, v: int, s: Strat, level: int) -> list[Strat]:
    """v's strategy s with each legal label on axis ``level`` (for a fixed operator, only those that
    can still end in one of its fixed strategies)."""
    cands = [_with(s, level, lab) for lab in problem.choices(v)]
    return [c for c in cands if problem.allows(v, c, level) and problem.shard(v, c).valid]


def _with(s: Strat, level: int, label: str) -> Strat:
    out = list(s)
    out[level] = label
    return tuple(out)


def _order(problem: ShardingProblem, order: str) -> list[int]:
    ops = list(range(problem.num_ops))
    if order == "graph":
        return ops
    if order == "cost":
        unsharded = [float(problem.op_costs(v, [(None,) * len(problem.mesh.shape)])[0][0]) for v in ops]
        return sorted(ops, key=lambda v: -unsharded[v])
    raise ValueError(f"unknown D-Rec order {order!r}")


def _local_costs(problem: ShardingProblem, v: int, cands: list[Strat], current: list[Strat],
                 level: int | None = None, assumption: str = "replicated") -> np.ndarray:
    """Cost of each candidate strategy of v: its own plus its edges to the neighbours as they stand.
    During the recursion (``level`` given), a neighbour that has not chosen this level's label yet is
    taken as replicated on it ("replicated"), left out ("adaptive"), or assumed to answer with its
    best label for that candidate, its own cost included ("lookahead")."""
    total = problem.op_costs(v, cands)[0].copy()
    for e in problem.incident[v]:
        edge = problem.edges[e]
        other = edge.dst if edge.src == v else edge.src
        if edge.src == edge.dst:
            total += np.diag(problem.edge_costs(e, cands, cands))
            continue
        pending = level is not None and current[other][level] is None
        if pending and assumption == "adaptive":
            continue
        if pending and assumption == "lookahead":
            replies = _level_candidates(problem, other, current[other], level)
            own = problem.op_costs(other, replies)[0]
            mat = problem.edge_costs(e, cands, replies) if edge.src == v else problem.edge_costs(e, replies, cands).T
            total += (mat + own[None, :]).min(axis=1)
            continue
        if edge.src == v:
            total += problem.edge_costs(e, cands, [current[edge.dst]])[:, 0]
        else:
            total += problem.edge_costs(e, [current[edge.src]], cands)[0, :]
    return total


def neighbourhood(problem: ShardingProblem, v: int, s: Strat) -> list[Strat]:
    """All strategies of v when they are few, else those that change one axis of s."""
    choices = problem.choices(v)
    if v in problem.fixed or len(choices) ** len(problem.mesh.shape) <= FULL_NEIGHBOURHOOD:
        return problem.strategies(v)
    out = [s]
    for level in range(len(s)):
        for lab in choices:
            if lab != s[level]:
                cand = _with(s, level, lab)
                if problem.shard(v, cand).valid:
                    out.append(cand)
    return out


def _local_memory(problem: ShardingProblem, v: int, cands: list[Strat], current: list[Strat]) -> np.ndarray:
    """Operator v's bytes under each candidate, with the memory edges it shares with its neighbours as they stand
    (ShardingProblem.edge_memory: a kept output's second copy)."""
    mem = problem.op_costs(v, cands)[1]
    for e in problem.memory_edges:
        edge = problem.edges[e]
        if edge.src == v:
            mem = mem + problem.edge_memory(e, cands, [current[edge.dst]])[:, 0]
        elif edge.dst == v:
            mem = mem + problem.edge_memory(e, [current[edge.src]], cands)[0, :]
    return mem


def _memory(problem: ShardingProblem, current: list[Strat]) -> float:
    return (sum(float(problem.op_costs(v, [s])[1][0]) for v, s in enumerate(current))
            + problem.assignment_edge_memory(current))


def _repair(problem: ShardingProblem, current: list[Strat]) -> int:
    """Leaner strategies until the memory fits: each move saves the most bytes per extra second."""
    moves = 0
    limit = problem.memory_limit_bytes * (1.0 + MEMORY_TOLERANCE)
    used = _memory(problem, current)
    while used > limit:
        best = None
        for v in range(problem.num_ops):
            cands = neighbourhood(problem, v, current[v])
            cost = _local_costs(problem, v, cands, current)
            mem = _local_memory(problem, v, cands, current)
            here = cands.index(current[v])
            saved = mem[here] - mem
            extra = cost - cost[here]
            for i in np.flatnonzero(saved > 0):
                score = extra[i] / saved[i]
                if best is None or score < best[0]:
                    best = (score, v, cands[i], saved[i])
        if best is None:
            return moves
        _, v, s, saved = best
        current[v] = s
        used -= saved
        moves += 1
    return moves


def _polish(problem: ShardingProblem, current: list[Strat]) -> int:
    """Coordinate descent: each operator takes its best strategy given its neighbours, within memory;
    when no single move helps, a move that would overflow memory is paired with the cheapest move
    elsewhere that frees enough (a swap)."""
    moves = 0
    for _ in range(POLISH_ROUNDS):
        single = _single_moves(problem, current)
        moves += single
        if single == 0:
            if not _swap(problem, current):
                break
            moves += 2
    return moves


def _single_moves(problem: ShardingProblem, current: list[Strat]) -> int:
    moves = 0
    limit = problem.memory_limit_bytes * (1.0 + MEMORY_TOLERANCE)
    used = _memory(problem, current)
    fits = used <= limit
    for v in range(problem.num_ops):
        cands = neighbourhood(problem, v, current[v])
        cost = _local_costs(problem, v, cands, current)
        mem = _local_memory(problem, v, cands, current)
        here = cands.index(current[v])
        allowed = (used - mem[here] + mem <= limit) if fits else (mem <= mem[here])
        cost = np.where(allowed, cost, np.inf)
        i = int(np.argmin(cost))
        if cost[i] < cost[here] * (1 - 1e-9) - 1e-15:
            used += mem[i] - mem[here]
            current[v] = cands[i]
            moves += 1
    return moves


def _swap(problem: ShardingProblem, current: list[Strat]) -> bool:
    """One improving pair of moves: a gain that overflows memory plus the cheapest sufficient saving."""
    limit = problem.memory_limit_bytes * (1.0 + MEMORY_TOLERANCE)
    used = _memory(problem, current)
    if used > limit:
        return False
    gains, savers = [], []
    for v in range(problem.num_ops):
        cands = neighbourhood(problem, v, current[v])
        cost = _local_costs(problem, v, cands, current)
        mem = _local_memory(problem, v, cands, current)
        here = cands.index(current[v])
        for i in range(len(cands)):
            d_cost, d_mem = cost[i] - cost[here], mem[i] - mem[here]
            if d_cost < 0 and used + d_mem > limit:
                gains.append((d_cost, v, cands[i], d_mem))
            elif d_mem < 0:
                savers.append((d_cost, v, cands[i], d_mem))
    if not gains or not savers:
        return False
    # each gain with the cheapest saving elsewhere that frees enough, best estimated total first
    savers.sort(key=lambda g: g[0])
    pairs = []
    for d_cost, v, s, d_mem in gains:
        need = used + d_mem - limit
        saver = next((g for g in savers if g[1] != v and -g[3] >= need), None)
        if saver is not None:
            pairs.append((d_cost + saver[0], v, s, saver[1], saver[2]))
    pairs.sort(key=lambda p: p[0])
    before = problem.evaluate(current).cost_s
    for estimate, v, s, w, s2 in pairs[:SWAP_GAINS]:
        if estimate >= 0:
            break
        trial = list(current)
        trial[v], trial[w] = s, s2
        ev = problem.evaluate(trial)
        if ev.fits and ev.cost_s < before * (1 - 1e-9):
            current[v], current[w] = s, s2
            return True
    return False
