"""The single-process reference of an asynchronous parameter-server run: a replay.

An asynchronous run has no synchronous counterpart to match: its result depends on the order in
which pushes reached the servers and on which weights each gradient was computed from. The servers
record both (advisor.executor.ps.server.run_async): for every pull, the version (updates applied so
far) of the weights it was answered from; for every push, the order it was applied in and the live
worker count that scaled it. Replaying those in one process -- each worker's gradient of step k
computed from the servers' weights at the versions its pulls saw, each server's pushes applied in
its order with the same arithmetic (advisor.executor.ps.step_math) -- must give the losses the
workers reported, to float rounding. It checks that the run computed every gradient on the weights
it says it did and applied every update once.

Only ``mode: ps`` is replayed: a hybrid run's replicated tensors follow the workers' all-reduce
groups, which the replay does not rebuild.
"""

from __future__ import annotations

import torch

from advisor.executor.ps.config import PsConfig
from advisor.executor.ps.model import init_rows, make_optimizers
from advisor.executor.ps.step_math import (apply_update, assemble, push_values, requested_rows, step_loss,
                                           worker_batch)


class _Server:
    """A server's pieces, optimizers and the snapshots of the versions some pull saw."""

    def __init__(self, cfg: PsConfig, index: int, report: dict):
        self.pieces = cfg.server_pieces(index)
        self.data = [init_rows(cfg.model, p.param, p.start, p.end, cfg.seed).requires_grad_() for p in self.pieces]
        self.optimizers = make_optimizers(cfg.optimizer, cfg.learning_rate, [(d, p.sparse) for d, p in zip(self.data, self.pieces)])
        record = report["async"]
        self.order = [tuple(x) for x in record["applied"]]           # (worker, step, live workers)
        self.seen = {(w, k): v for w, k, v in record["pulls"]}        # (worker, step) -> version
        self.readers: dict[int, int] = {}                              # version -> gradients still to compute from it
        for v in self.seen.values():
            self.readers[v] = self.readers.get(v, 0) + 1
        self.version, self.done = 0, 0
        self.snapshots: dict[int, list[torch.Tensor]] = {}
        self._snapshot()

    def _snapshot(self) -> None:
        if self.readers.get(self.version):
            self.snapshots[self.version] = [d.detach().clone() for d in self.data]

    def read(self, version: int) -> None:
        """One gradient was computed from the version: drop its copy once none is left to compute."""
        self.readers[version] -= 1
        if not self.readers[version]:
            del self.snapshots[version]


def replay(cfg: PsConfig, server_reports: list[dict]) -> dict[tuple[int, int], float]:
    """{(worker, step): loss} of every push the servers applied, recomputed in one process."""
    torch.sparse.check_sparse_tensor_invariants.disable()     # as the servers
    servers = {r["index"]: _Server(cfg, r["index"], r) for r in server_reports}
    pieces = {s: srv.pieces for s, srv in servers.items()}
    computed: dict[tuple[int, int], tuple[float, dict[int, list[torch.Tensor]], dict]] = {}
    losses: dict[tuple[int, int], float] = {}
    appliers: dict[tuple[int, int], int] = {}           # servers still to apply each push
    for srv in servers.values():
        for w, k, _ in srv.order:
            appliers[(w, k)] = appliers.get((w, k), 0) + 1

    def gradient(w: int, k: int):
        """(loss, push values per server, requested rows per server), or None until every server
        has reached the version the worker's pull of it saw."""
        versions = {s: srv.seen.get((w, k)) for s, srv in servers.items()}
        if any(v is None or v not in servers[s].snapshots for s, v in versions.items()):
            return None
        batch, unique = worker_batch(cfg, w, k)
        values = {}
        for s, srv in servers.items():
            snap = srv.snapshots[versions[s]]
            values[s] = [d[requested_rows(unique, p)] if p.sparse else d for d, p in zip(snap, srv.pieces)]
        for s, srv in servers.items():
            srv.read(versions[s])
        pulled = assemble(cfg, pieces, values, unique)
        loss = step_loss(cfg, pulled, unique, batch)
        loss.backward()
        pushes = {s: push_values(loss, pulled, srv.pieces, unique) for s, srv in servers.items()}
        rows = {s: [requested_rows(unique, p) if p.sparse else None for p in srv.pieces] for s, srv in servers.items()}
        return loss.item(), pushes, rows

    while any(srv.done < len(srv.order) for srv in servers.values()):
        progressed = False
        for s, srv in servers.items():
            while srv.done < len(srv.order):
                w, k, n = srv.order[srv.done]
                if (w, k) not in computed:
                    got = gradient(w, k)
                    if got is None:
                        break
                    computed[(w, k)] = got
                    losses[(w, k)] = got[0]
                _, pushes, rows = computed[(w, k)]
                apply_update(srv.pieces, srv.data, srv.optimizers, [pushes[s]], [rows[s]], n)
                appliers[(w, k)] -= 1
                if not appliers[(w, k)]:
                    del computed[(w, k)]         # every server has applied it: keep its loss only
                srv.version += 1
                srv.done += 1
                srv._snapshot()
                progressed = True
        if not progressed:
            raise RuntimeError("the servers' records of an asynchronous run cannot be replayed: a push needs "
                               "weights no server reached")
    return losses
