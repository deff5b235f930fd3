"""NASPipe's causal synchronous parallel (CSP) pipeline schedule for supernet training (Zhao et al.,
"NASPipe: High Performance and Reproducible Pipeline Parallel Supernet Training via Causal Synchronous
Parallelism", ASPLOS 2022, sec. 4).

Supernet training samples one subnet per batch (one choice per layer) and trains it for one step;
trained one after another, each subnet sees the weights every earlier subnet left. NASPipe pipelines
the subnets over the stages and keeps that result: a subnet may run its part on a stage only once
every earlier subnet that shares one of that stage's blocks with it (the same candidate of the same
layer, or a block every subnet uses: the embedding, the head) has finished its backward pass and
update there; subnets that share nothing there may overtake blocked earlier ones. Each block then
sees the same sequence of reads and updates as in sequential training, so the losses are the same.

``simulate`` plays the schedule with given action times (list scheduling in time order: an idle stage
takes the lowest-numbered ready backward, else the lowest-numbered ready forward; at most ``window``
subnets in flight, as 1F1B bounds activations to the pipeline depth). It returns the makespan and the
order of each stage's actions, which the executor (advisor.executor.supernet) replays. Like advisor.cost.bubble, it prices a schedule.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

FORWARD, BACKWARD = "F", "B"
SHARED = -1          # the block key of what every subnet uses on a stage (embedding, head)


@dataclass(frozen=True)
class Schedule:
    makespan_s: float
    orders: tuple[tuple[tuple[str, int], ...], ...]    # per stage: (action, subnet) in the order run
    busy_s: tuple[float, ...]                            # per stage: seconds of work
    overtakes: int      # forwards run ahead of an earlier subnet held back by a shared block

    @property
    def utilization(self) -> float:
        return float(np.mean(self.busy_s)) / self.makespan_s if self.makespan_s > 0 else 0.0


def sample_subnets(num_subnets: int, num_layers: int, num_candidates: int, seed: int) -> np.ndarray:
    """(subnets, layers) candidate indices, uniform per layer (single-path sampling, SPOS sec. 3.2)."""
    return np.random.default_rng(seed).integers(0, num_candidates, size=(num_subnets, num_layers))


def stage_blocks(choices: np.ndarray, stage_layers: tuple[int, ...], shared_ends: bool) -> list[list[frozenset]]:
    """Per subnet and stage, the blocks it uses there: (layer, candidate) pairs, and SHARED on the first
    and last stage when the embedding and head train with every subnet."""
    bounds = np.cumsum((0,) + tuple(stage_layers))
    out = []
    for row in choices:
        per_stage = []
        for s in range(len(stage_layers)):
            blocks = {(int(layer), int(row[layer])) for layer in range(bounds[s], bounds[s + 1])}
            if shared_ends and s in (0, len(stage_layers) - 1):
                blocks.add((SHARED, s))
            per_stage.append(frozenset(blocks))
        out.append(per_stage)
    return out


def dependencies(blocks: list[list[frozenset]], causal: bool = True) -> list[list[tuple[int, ...]]]:
    """For each subnet and stage, the earlier subnets it waits for there: per shared block, its last
    earlier user (earlier users of that block finished before that one started)."""
    last: list[dict] = [dict() for _ in blocks[0]] if blocks else []
    out = []
    for j, per_stage in enumerate(blocks):
        row = []
        for s, used in enumerate(per_stage):
            row.append(tuple(sorted({last[s][b] for b in used if b in last[s]})) if causal else ())
            for b in used:
                last[s][b] = j
        out.append(row)
    return out


def simulate(forward_s: np.ndarray, backward_s: np.ndarray, p2p_s: float, deps: list[list[tuple[int, ...]]],
             window: int) -> Schedule:
    """Play the schedule: forward_s / backward_s (subnets, stages) seconds per action (the backward
    includes the update of the blocks it used), p2p_s per transfer between neighbouring stages."""
    n, p = forward_s.shape
    f_end = np.full((n, p), np.inf)
    b_end = np.full((n, p), np.inf)
    free = np.zeros(p)
    orders: list[list[tuple[str, int]]] = [[] for _ in range(p)]
    next_fwd = [0] * p               # lowest subnet not yet forwarded on each stage
    done_f = [set() for _ in range(p)]
    done_b = [set() for _ in range(p)]
    in_flight, t = 0, 0.0
    events: list[float] = [0.0]

    def f_ready(j: int, s: int) -> float:
        prev = 0.0 if s == 0 else f_end[j, s - 1] + p2p_s
        dep = max((b_end[i, s] for i in deps[j][s]), default=0.0)
        return max(prev, dep)

    def b_ready(j: int, s: int) -> float:
        return f_end[j, s] if s == p - 1 else b_end[j, s + 1] + p2p_s

    while len(done_b[0]) < n:
        for s in range(p):
            if free[s] > t:
                continue
            pick = None
            ready_b = [j for j in done_f[s] - done_b[s] if b_ready(j, s) <= t]
            if ready_b:
                pick = (BACKWARD, min(ready_b))
            else:
                for j in range(next_fwd[s], min(n, next_fwd[s] + window)):
                    if j in done_f[s] or (s == 0 and in_flight >= window):
                        continue
                    if s > 0 and j not in done_f[s - 1]:
                        continue
                    if f_ready(j, s) <= t:
                        pick = (FORWARD, j)
                        break
            if pick is None:
                continue
            kind, j = pick
            if kind == FORWARD:
                f_end[j, s] = t + forward_s[j, s]
                free[s] = f_end[j, s]
                done_f[s].add(j)
                in_flight += s == 0
                while next_fwd[s] in done_f[s]:
                    next_fwd[s] += 1
            else:
                b_end[j, s] = t + backward_s[j, s]
                free[s] = b_end[j, s]
                done_b[s].add(j)
                in_flight -= s == 0
            orders[s].append(pick)
            heapq.heappush(events, float(free[s]))
            heapq.heappush(events, float(free[s] + p2p_s))
        # advance to the next moment anything can change
        while events and events[0] <= t:
            heapq.heappop(events)
        if not events:
            break
        t = events[0]
    busy = tuple(float(forward_s[:, s].sum() + backward_s[:, s].sum()) for s in range(p))
    # forwards that ran ahead of a lower-numbered subnet not yet forwarded on that stage (held back
    # there by a block it shares with an unfinished earlier subnet): NASPipe's out-of-order starts
    overtakes = 0
    for order in orders:
        done, lowest = set(), 0
        for kind, j in order:
            if kind == FORWARD:
                overtakes += j != lowest
                done.add(j)
                while lowest in done:
                    lowest += 1
    return Schedule(float(b_end[:, 0].max()), tuple(tuple(o) for o in orders), busy, int(overtakes))


def sequential_s(forward_s: np.ndarray, backward_s: np.ndarray, p2p_s: float) -> float:
    """One subnet at a time through the stages (what exact sequential training does on a pipeline)."""
    n, p = forward_s.shape
    return float(forward_s.sum() + backward_s.sum() + n * 2 * (p - 1) * p2p_s)
