"""The layout of each message between a worker and a server (advisor.executor.ps.wire), as both
sides compute it from the configuration and the pull request of the step:

* pull request (worker -> server): for each sparse piece of the server, the ids of the rows the
  worker's batch looks up, at most min(the piece's rows, local batch x lookups per sample);
* answer (server -> worker): those rows of each sparse piece, every other piece whole;
* push (worker -> server): the worker's loss, then the gradient of exactly what was answered.

A synchronous worker sends pull k, push k, pull k + 1, ...; an asynchronous one asks for the next
step's weights before it computes the current step (advisor.executor.ps.worker), so its messages
to a server run pull 0, pull 1, push 0, pull 2, push 1, ..., push S - 1: each push follows the pull
after its own, and carries the gradient of the rows its own pull asked for.

A request's slots are padded to their capacity, so a table split over S servers sends each of them
room for all of a worker's lookups: up to S times the ids actually asked for. Ids are 8 bytes against
a row's dim x 4 of values, and the cost model counts the ids asked for, not this padding.
"""

from __future__ import annotations

from advisor.executor.ps.config import Piece, PsConfig
from advisor.executor.ps.wire import PULL, PUSH, Layout, Message


def _row_width(cfg: PsConfig, piece: Piece) -> int:
    width = 1
    for s in cfg.model.param_shapes()[piece.param][1:]:
        width *= s
    return width


def request_layout(cfg: PsConfig, server: int) -> Layout:
    caps = []
    for p in cfg.server_pieces(server):
        if p.sparse:
            table = cfg.model.table(p.param)
            caps.append(min(p.end - p.start, cfg.local_batch_size * table.lookups))
    return Layout(ids=tuple(caps))


def answer_layout(cfg: PsConfig, server: int, counts: list[int]) -> Layout:
    """``counts``: the rows requested of each sparse piece, in the server's piece order."""
    rows = iter(counts)
    values = [(next(rows) if p.sparse else p.end - p.start) * _row_width(cfg, p) for p in cfg.server_pieces(server)]
    return Layout(values=tuple(values))


def push_layout(cfg: PsConfig, server: int, counts: list[int]) -> Layout:
    return Layout(values=(1,) + answer_layout(cfg, server, counts).values)


def replica_layout(cfg: PsConfig, server: int) -> Layout:
    """A primary's applied update to its backup (advisor.executor.ps.server): per sparse piece the row ids
    of every worker's request (at most the workers x a request's capacity), per piece the gradient values."""
    caps = iter(request_layout(cfg, server).ids)
    ids, values = [], []
    for p in cfg.server_pieces(server):
        if p.sparse:
            rows = cfg.workers * next(caps)
            ids.append(rows)
            values.append(rows * _row_width(cfg, p))
        else:
            values.append((p.end - p.start) * _row_width(cfg, p))
    return Layout(ids=tuple(ids), values=tuple(values))


def requested_counts(request: Message) -> list[int]:
    return [t.numel() for t in request.ids]


def server_inbox_layouts(cfg: PsConfig, server: int):
    """A server's expected next message from a worker: a pull request, then the push it implies
    (asynchronous: the order in the module doc)."""
    if not cfg.synchronous:
        return _async_layouts(cfg, server)

    def layout(_peer: int, previous: Message | None) -> Layout:
        if previous is None or previous.kind == PUSH:
            return request_layout(cfg, server)
        if previous.kind == PULL:
            return push_layout(cfg, server, requested_counts(previous))
        raise ValueError(f"server {server}: a message of unknown kind {previous.kind}")
    return layout


def async_next_kind(pulls: int, pushes: int, steps: int) -> int:
    """The kind of an asynchronous worker's next message after ``pulls`` pulls and ``pushes``
    pushes of a ``steps``-step run: a pull while it has asked for at most one step ahead."""
    return PULL if pulls < steps and pulls <= pushes + 1 else PUSH


def _async_layouts(cfg: PsConfig, server: int):
    seen: dict[int, list] = {}      # peer -> [pulls, pushes, requested counts of each pull]

    def layout(peer: int, previous: Message | None) -> Layout:
        state = seen.setdefault(peer, [0, 0, []])
        if previous is not None:
            if previous.kind == PULL:
                state[0] += 1
                state[2].append(requested_counts(previous))
            else:
                state[1] += 1
        if async_next_kind(state[0], state[1], cfg.steps) == PULL:
            return request_layout(cfg, server)
        return push_layout(cfg, server, state[2][state[1]])
    return layout
