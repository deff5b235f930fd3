"""Figures derived from one StrategyBatch, computed once while the cost model prices that batch.

Every part of an estimate (memory, stage times, placements, the data-parallel and pipeline terms) reads
the same derived arrays of the batch (its mesh layout, stage masks, per-stage parameters); the batch is
immutable, so they are kept for the batch being priced and the one priced before it (held weakly), and
handed out read-only.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")

# [(the batch (weak reference), {key: value})], the latest first: a batch and the one priced within it (the
# stages that can hold its memory peak, advisor.cost.memory.peak_stages) keep theirs
_RECENT: list = []
_KEPT = 2


def per_batch(b, key, make: Callable[[], T], of: object = None) -> T:
    """make() for batch b, computed once while b is the batch being priced; arrays in the value are
    made read-only (they are shared by every reader). ``of``: an object the value also depends on (a model),
    told apart by identity and kept alive with the entry, so that its identity is not reused meanwhile."""
    hit = next((i for i, (ref, _) in enumerate(_RECENT) if ref() is b), None)
    if hit is None:
        _RECENT.insert(0, (weakref.ref(b), {}))
        del _RECENT[_KEPT:]
    elif hit:
        _RECENT.insert(0, _RECENT.pop(hit))
    cache = _RECENT[0][1]
    full = (key, id(of))
    if full not in cache:
        value = make()
        for a in value if isinstance(value, tuple) else (value,):
            if isinstance(a, np.ndarray):
                a.setflags(write=False)
        cache[full] = (value, of)
    return cache[full][0]


def cached(fn: Callable[..., T]) -> Callable[..., T]:
    """fn(b) or fn(model, b), computed once per batch (and model) while that batch is priced (per_batch)."""
    @functools.wraps(fn)
    def once(*args):
        return per_batch(args[-1], fn.__qualname__, lambda: fn(*args), of=args[0] if len(args) == 2 else None)
    return once
