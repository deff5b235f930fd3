"""Sizing work to each device type's speed on a mixed cluster (advisor.search.mixed), vectorized.

Both choices are min-max problems over affine times, solved the same way: the cost model gives each
stage's (or type's) time as a + b x work (two pricings, one unit of work apart); bisection finds the
smallest pace T at which the units that finish by T (and fit in memory) cover the work; the surplus
is then taken back where it costs most, which never raises the pace. Metis (Um et al., USENIX ATC
2024, sec. 5) sizes layers per stage and batch per replica by device speed and memory the same way.
"""

from __future__ import annotations

import numpy as np

BISECTION_STEPS = 60        # halves the pace interval 60 times: far below any cost model resolution
MAX_ROUNDS = 256            # surplus give-back rounds for the stage layers (each removes one layer)


def _bisect(lo: np.ndarray, hi: np.ndarray, covers) -> np.ndarray:
    """Per row, (close to) the smallest T in [lo, hi] with covers(T) (covers(hi) holds)."""
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        ok = covers(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


def stage_layers_by_speed(fixed_s: np.ndarray, per_layer_s: np.ndarray, max_layers: np.ndarray,
                          active: np.ndarray, num_layers: int) -> np.ndarray:
    """(N, P) layers per stage minimizing the slowest stage's time fixed + per_layer x layers, each
    stage at least 1 and at most max_layers (its memory); even layers where no split fits."""
    big = np.where(active, fixed_s + per_layer_s * num_layers, 0.0).max(axis=1)
    cap = np.where(active, np.clip(max_layers, 0, num_layers), 0)

    def take(t):
        can = np.floor((t[:, None] - fixed_s) / np.maximum(per_layer_s, 1e-30))
        return np.where(active, np.clip(can, 0, cap), 0).astype(np.int64)

    def covers(t):
        layers = take(t)
        return (layers.sum(axis=1) >= num_layers) & np.all(~active | (layers >= 1), axis=1)

    fits = covers(big)
    lo = np.where(active, fixed_s + per_layer_s, 0.0).max(axis=1)
    layers = take(_bisect(lo, np.where(fits, big, lo), covers))
    for _ in range(MAX_ROUNDS):              # give back the surplus from the slowest stages
        surplus = layers.sum(axis=1) - num_layers
        todo = fits & (surplus > 0)
        if not todo.any():
            break
        time = np.where(active & (layers > 1), fixed_s + per_layer_s * layers, -np.inf)
        worst = np.argmax(time, axis=1)
        rows = np.flatnonzero(todo)
        layers[rows, worst[rows]] -= 1
    return np.where(fits[:, None], layers, 0)


def micro_batches_by_speed(fixed_s: np.ndarray, per_micro_s: np.ndarray, replicas: np.ndarray,
                           total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batches per replica on each of T types, (N, T) each: the largest count of a replica of
    the type and how many of its replicas run it (the others run one fewer), so that every replica
    has at least one, the counts sum to ``total`` and the slowest type (fixed + per_micro x count)
    is as fast as it can be."""
    def take(t):
        return np.maximum(np.floor((t[:, None] - fixed_s) / np.maximum(per_micro_s, 1e-30)), 0).astype(np.int64)

    def covers(t):
        q = take(t)
        return ((q * replicas).sum(axis=1) >= total) & np.all(q >= 1, axis=1)

    even = -(-total // replicas.sum(axis=1))
    hi = np.max(fixed_s + per_micro_s * even[:, None], axis=1) * (1.0 + 1e-12)
    lo = np.max(fixed_s + per_micro_s, axis=1)
    q = np.maximum(take(_bisect(lo, np.maximum(hi, lo), covers)), 1)
    # give the surplus back, the slowest type first (fewer micro-batches never slow a type), each
    # replica keeping at least one; a type's count c runs as q = ceil(c / replicas) on ``full``
    # replicas and q - 1 on the others
    counts = q * replicas
    surplus = counts.sum(axis=1) - total
    rows = np.arange(len(total))
    for t in np.argsort(-(fixed_s + per_micro_s * q), axis=1, kind="stable").T:
        give = np.clip(np.minimum(surplus, counts[rows, t] - replicas[rows, t]), 0, None)
        counts[rows, t] -= give
        surplus = surplus - give
    q = -(-counts // replicas)
    return q, counts - (q - 1) * replicas
