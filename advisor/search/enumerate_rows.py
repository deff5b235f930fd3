"""The enumerator's row tables (advisor.search.enumerate): candidates as parallel numpy columns.

Holds the mesh orders and the strides they give, the layers per pipeline stage, the helpers that
cross, take and concatenate rows, and the conversion of rows into the cost model's StrategyBatch
(to_batch, finalist_batch), cut into calls of one pipeline depth (chunks_by_pp).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np

from advisor.space.strategy import DEFAULT_MESH_ORDER, MESH_DIMS, ONE_F_ONE_B, StrategyBatch, even_stage_layers
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

# Stage-axis cells (candidates x pipeline stages) per cost-model call: bounds the arrays' memory.
PRICE_CELLS = 400_000
# Stage-axis cells of padding a cost-model call may add to take rows of a smaller pp along (chunks_by_pp): about
# what one call's fixed cost buys (measured by benchmarks/search_speed.py: about 3 ms a call and 0.1-0.3 us a
# cell on the development machine; 20,000 cells are 2-6 ms)
PAD_CELLS = 20_000

Rows = dict[str, np.ndarray]

# ---- mesh orders --------------------------------------------------------------------------------
def _inversions(order: tuple[str, ...]) -> int:
    pos = [DEFAULT_MESH_ORDER.index(d) for d in order]
    return sum(1 for i in range(len(pos)) for j in range(i + 1, len(pos)) if pos[i] > pos[j])


# All orders, the default first, then by distance from it: the first order giving a stride pattern
# is the one reported for it.
MESH_ORDERS: tuple[tuple[str, ...], ...] = tuple(sorted(itertools.permutations(MESH_DIMS), key=_inversions))
DEFAULT_ORDER_INDEX = MESH_ORDERS.index(DEFAULT_MESH_ORDER)


def _representative_orders(active: tuple[bool, ...]) -> np.ndarray:
    """Indices of the orders that differ in the relative order of the active dimensions (see
    _active_code). A dimension of degree 1 changes no other stride, and distinct relative orders of
    the active ones give them distinct strides, so this is exactly de-duplication by the strides
    that can matter."""
    seen: dict[tuple[str, ...], int] = {}
    for i, order in enumerate(MESH_ORDERS):
        key = tuple(d for d in order if active[MESH_DIMS.index(d)])
        seen.setdefault(key, i)
    return np.array(sorted(seen.values()), dtype=np.int64)


def _representative_table() -> np.ndarray:
    """(16, orders) bool: whether order j represents its stride pattern, by active-dimension code."""
    table = np.zeros((16, len(MESH_ORDERS)), dtype=bool)
    for code in range(16):
        table[code, _representative_orders(tuple(bool(code >> i & 1) for i in range(4)))] = True
    return table


_IS_REPRESENTATIVE = _representative_table()
# Position of each of MESH_DIMS in each order (0 = outermost).
_ORDER_POSITIONS = np.array([[order.index(d) for d in MESH_DIMS] for order in MESH_ORDERS], dtype=np.int64)


def _active_code(rows: Rows) -> np.ndarray:
    """Bit i set when MESH_DIMS[i]'s stride can matter: its degree is above 1, or, for dp, cp or ep
    is (the data-parallel group spans dp x cp ranks and hosts the experts, so its stride is read)."""
    active = {d: rows[d] > 1 for d in MESH_DIMS}
    active["dp"] = active["dp"] | active["cp"] | (rows["ep"] > 1)
    return sum(active[d].astype(np.int64) << i for i, d in enumerate(MESH_DIMS))


def mesh_strides(rows: Rows, order_index: np.ndarray) -> dict[str, np.ndarray]:
    """Stride of each mesh dimension for each row under MESH_ORDERS[order_index]."""
    pos = _ORDER_POSITIONS[order_index]                        # (N, 4): position of each dim
    deg = np.stack([rows[d] for d in MESH_DIMS], axis=1)       # (N, 4)
    out = {}
    for k, dim in enumerate(MESH_DIMS):
        inner = pos > pos[:, [k]]
        out[f"{dim}_stride"] = np.prod(np.where(inner, deg, 1), axis=1)
    return out


# ---- pipeline stages ----------------------------------------------------------------------------
def stage_layers_for(model: ModelSpec, pp: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """Layers per pipeline stage, (N, max pp) zero-padded. The one place the enumerator chooses a
    partition (an even split for now; a balanced partitioner can replace this function)."""
    width = int(pp.max()) if len(pp) else 1
    table = np.zeros((width + 1, width), dtype=np.int64)
    for p in np.flatnonzero(np.bincount(pp, minlength=1)):
        if p <= model.num_layers:
            table[p, :p] = even_stage_layers(model.num_layers, int(p))
    return table[pp]


# ---- row tables ---------------------------------------------------------------------------------
def divisors(n: int) -> np.ndarray:
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def _options(pinned, default: np.ndarray) -> np.ndarray:
    return np.asarray([pinned] if pinned is not None else default, dtype=np.int64)


def _take(rows: Rows, index) -> Rows:
    return {k: v[index] for k, v in rows.items()}


def _cross(rows: Rows, options: Rows) -> Rows:
    """Every row with every option (options: parallel arrays of equal length)."""
    n = len(next(iter(rows.values())))
    k = len(next(iter(options.values())))
    out = {name: np.repeat(col, k) for name, col in rows.items()}
    out.update({name: np.tile(np.asarray(vals, dtype=np.int64), n) for name, vals in options.items()})
    return out


def _count(rows: Rows) -> int:
    return len(next(iter(rows.values())))


def _concat(parts: list[Rows], like: Rows) -> Rows:
    if not parts:
        return {k: v[:0] for k, v in like.items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


# The "offload" column: 0 nothing, 1 the optimizer states, 2 the weights and gradients too (ZeRO-3),
# 3 the word embedding on the host (advisor.cost.host_embedding), 4 that and the optimizer states.
OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS, HOST_EMBEDDING, HOST_EMBEDDING_OPTIMIZER = 1, 2, 3, 4
OPTIMIZER_ON_HOST = (OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS, HOST_EMBEDDING_OPTIMIZER)

_DEFAULTS = {"ep": 1, "mbs": 1, "vpp": 1, "schedule": ONE_F_ONE_B, "sp": 0, "recompute": 0,
             "zero": 0, "offload": 0, "mesh": DEFAULT_ORDER_INDEX, "cp_comm": 0, "fold": 0}


def to_batch(model: ModelSpec, job: TrainingJob, rows: Rows) -> StrategyBatch:
    """The cost model's input for these rows (mesh_order left empty: strides carry it)."""
    n = _count(rows)
    col = {k: rows[k] if k in rows else np.full(n, v, dtype=np.int64) for k, v in _DEFAULTS.items()}
    m = rows["m"] if "m" in rows else np.maximum(job.global_batch_size // np.maximum(rows["dp"], 1), 1)
    return StrategyBatch(
        dp=rows["dp"], tp=rows["tp"], pp=rows["pp"], cp=rows["cp"], ep=col["ep"],
        sequence_parallel=col["sp"].astype(bool), virtual_pipeline_stages=col["vpp"],
        micro_batch_size=col["mbs"], num_micro_batches=m, zero_stage=col["zero"],
        recompute=col["recompute"], recompute_layers=np.full((n, int(rows["pp"].max()) if n else 1), -1, dtype=np.int64),
        pipeline_schedule=col["schedule"], offload_optimizer=np.isin(col["offload"], OPTIMIZER_ON_HOST),
        offload_params=col["offload"] == OFFLOAD_PARAMS, host_embedding=col["offload"] >= HOST_EMBEDDING,
        stage_layers=stage_layers_for(model, rows["pp"], col["vpp"]),
        cp_comm=col["cp_comm"], fold_experts=col["fold"].astype(bool),
        **mesh_strides(rows, col["mesh"]),
    )


def finalist_batch(model: ModelSpec, job: TrainingJob, rows: Rows) -> StrategyBatch:
    """Like to_batch, with each candidate's mesh order filled in (for Strategy objects)."""
    batch = to_batch(model, job, rows)
    return replace(batch, mesh_order=tuple(MESH_ORDERS[int(i)] for i in rows["mesh"]))


def chunks_by_pp(rows: Rows, cells: int = PRICE_CELLS, padding: int = PAD_CELLS):
    """Index arrays of rows of neighbouring pp values, at most `cells` candidates x stages each. Rows of
    smaller pp join a call of larger pp while the stage-axis cells their padding adds stay within
    `padding` (a cost-model call's fixed cost weighed against the padded cells' work)."""
    pp = rows["pp"]
    counts = np.bincount(pp) if len(pp) else np.zeros(0, dtype=np.int64)
    values = np.flatnonzero(counts)
    groups, members, waste = [], 0, 0
    for k, p in enumerate(values):
        extra = waste + members * (int(p) - int(values[k - 1])) if k else 0
        if k and extra <= padding and (members + counts[p]) * int(p) <= cells:
            groups[-1].append(p)
            waste, members = extra, members + int(counts[p])
        else:
            groups.append([p])
            waste, members = 0, int(counts[p])
    for group in groups:
        idx = np.flatnonzero(np.isin(pp, group))
        step = max(cells // int(group[-1]), 1)
        for first in range(0, len(idx), step):
            yield idx[first:first + step]


def _add(counter: Counter, key: str, value: int) -> None:
    if value:
        counter[key] += value
