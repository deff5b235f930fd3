"""Every candidate the exhaustive enumerator can rank, priced and streamed as CSV rows
(``advisor recommend --all-candidates FILE``), as Calculon writes all of its candidates.

The same space as the search (advisor.search.enumerate: the pins, the legality rules, the
framework's record), priced by the same cost model, but without the throughput bound: every
candidate whose memory bound lets it fit is priced exactly under each of its mesh orders, one
chunk of rows at a time, and the chunk's rows are written before the next is priced, so memory
stays that of one chunk whatever the space's size. A candidate that does not fit is not written
(the memory bound or the exact memory rules it out); the count of each is returned.

One row per candidate: the strategy's settings under their plan keys (advisor.space.strategy), then
the prediction: tokens per second and the pessimistic end of its error band (what recommend ranks
by), step time, MFU, memory per device by part (GiB, the fullest stage), and each part of the step
time (seconds per step, advisor.cost.estimate's time parts).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass
from typing import IO, Callable

import numpy as np

from advisor.cost.confidence import pessimistic_tokens_per_s
from advisor.cost.memory import GIB
from advisor.search import Pins
from advisor.search.enumerate import FAMILY_BATCH_CELLS, _chunk_end, _Scoring, _ranges, _space
from advisor.search.enumerate_bounds import family_bounds
from advisor.search.enumerate_rows import DEFAULT_ORDER_INDEX, MESH_ORDERS, _count, _take
from advisor.space.strategy import CP_COMM, RECOMPUTE, SCHEDULES
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

STRATEGY_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "sequence_parallel", "virtual_pipeline_stages", "micro_batch_size",
                    "num_micro_batches", "zero_stage", "offload_optimizer", "offload_params", "host_embedding",
                    "recompute", "pipeline_schedule", "cp_comm", "fold_experts", "mesh_order", "stage_layers")
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers", "total")
PREDICTION_COLUMNS = ("tokens_per_s", "tokens_per_s_low", "step_time_s", "mfu") + tuple(
    f"memory_{p}_gib" for p in MEMORY_PARTS)


@dataclass(frozen=True)
class Written:
    rows: int              # candidates written (each fits)
    priced: int            # candidates priced exactly
    candidates: int        # the legal candidates of the space (advisor.search.enumerate.space_size)
    pruned: dict           # candidates not written, by reason (each does not fit)


class _Everything(_Scoring):
    """_Scoring with no throughput bound: every candidate that may fit is priced, and each priced chunk goes to
    ``sink`` (the rows that fit, their batch and estimate) instead of being kept."""

    def __init__(self, model, hw, cluster, job, pins, options, pruned, sink):
        super().__init__(model, hw, cluster, job, pins, options, 1, pruned, True)
        self.sink = sink

    @property
    def limit(self) -> float:
        return 0.0

    def best_first(self, upper, cells, variants, process, budget: int) -> None:
        """Every item, in chunks of ``budget`` cells (no bound to order them by)."""
        order = np.arange(len(upper))
        pos = 0
        while pos < len(order):
            end = _chunk_end(order, pos, cells, budget)
            process(order[pos:end])
            pos = end

    def _exact(self, pairs) -> None:
        model, hw, cluster, job = self.args
        for part, batch, e, ok in self.priced(pairs):
            if ok.any():
                self.sink(part, batch, e, pessimistic_tokens_per_s(model, hw, job, batch, e), ok)


def write_all(out: IO[bytes], model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
              pins: Pins = Pins(), progress: Callable[[int, int], None] | None = None) -> Written:
    """Write the header and every fitting candidate of the space to ``out`` (binary), a chunk at a time."""
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.writer(text)
    time_parts: list[str] = []
    written = [0]

    def sink(rows, batch, e, low, ok) -> None:
        if not time_parts:      # the estimate's parts, in its order, fixed by the first chunk
            time_parts.extend(e.time_s)
            writer.writerow(STRATEGY_COLUMNS + PREDICTION_COLUMNS + tuple(f"time_{p}_s" for p in time_parts))
        idx = np.flatnonzero(ok)
        cols = _strategy_columns(rows, batch, idx)
        mem = e.memory
        figures = [e.tokens_per_s[idx], low[idx], e.step_time_s[idx], e.mfu[idx]] + [
            getattr(mem, p)[idx] / GIB for p in MEMORY_PARTS] + [
            np.broadcast_to(np.asarray(e.time_s[p], dtype=float), (len(ok),))[idx] for p in time_parts]
        formatted = [np.char.mod("%.6g", np.asarray(f, dtype=float)) for f in figures]
        writer.writerows(zip(*cols, *formatted))
        written[0] += len(idx)

    pruned: Counter = Counter()
    dedup: Counter = Counter()
    skel, variants, options = _space(model, hw, cluster, job, pins, pruned, dedup)
    pruned = Counter()          # the space's legality counts are not candidates; from here on what does not fit
    everything = _Everything(model, hw, cluster, job, pins, options, pruned, sink)
    starts, _ = family_bounds(model, hw, cluster, job, skel, options, pins)
    ends = np.r_[starts[1:], _count(skel)].astype(np.int64)
    cells = np.add.reduceat(skel["pp"], starts) if len(starts) else np.zeros(0, dtype=np.int64)
    done = [0]

    def expand(families: np.ndarray) -> None:
        members = _ranges(starts[families], ends[families])
        everything.score_skeletons(_take(skel, members), variants[members])
        done[0] += len(families)
        if progress:
            progress(done[0], len(starts))

    everything.best_first(np.zeros(len(starts)), cells, np.zeros(len(starts)), expand, FAMILY_BATCH_CELLS)
    if not time_parts:
        writer.writerow(STRATEGY_COLUMNS + PREDICTION_COLUMNS)
    text.flush()
    text.detach()
    return Written(rows=written[0], priced=everything.scored, candidates=int(variants.sum()), pruned=dict(pruned))


def _strategy_columns(rows, batch, idx) -> list:
    """The strategy's settings of the rows ``idx``, as CSV text columns in STRATEGY_COLUMNS' order."""
    def ints(a):
        return np.asarray(a)[idx].astype(np.int64).astype(str)

    def flags(a):
        return np.where(np.asarray(a)[idx], "true", "false")

    names = np.array(["-".join(o) for o in MESH_ORDERS])
    mesh = np.asarray(rows["mesh"]) if "mesh" in rows else np.full(len(batch), DEFAULT_ORDER_INDEX)
    layers = ["/".join(map(str, r[:p])) for r, p in zip(batch.stage_layers[idx].tolist(), batch.pp[idx].tolist())]
    return [ints(batch.dp), ints(batch.tp), ints(batch.pp), ints(batch.cp), ints(batch.ep),
            flags(batch.sequence_parallel), ints(batch.virtual_pipeline_stages), ints(batch.micro_batch_size),
            ints(batch.num_micro_batches), ints(batch.zero_stage), flags(batch.offload_optimizer),
            flags(batch.offload_params), flags(batch.host_embedding),
            np.array(RECOMPUTE)[batch.recompute[idx]], np.array(SCHEDULES)[batch.pipeline_schedule[idx]],
            np.array(CP_COMM)[batch.cp_comm[idx]], flags(batch.fold_experts), names[mesh[idx]],
            np.array(layers)]
