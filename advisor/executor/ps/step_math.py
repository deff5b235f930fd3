"""What a worker computes from the tensors it pulled and what a server does with a push, as plain
functions: the processes (advisor.executor.ps.worker, .server) and the single-process replay of an
asynchronous run (advisor.executor.ps.replay) share them, so the replay does the same arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from advisor.executor.ps.config import Piece, PsConfig
from advisor.executor.ps.model import forward, global_batch, loss_of, pool, worker_slice


def worker_batch(cfg: PsConfig, worker: int, step: int):
    """(the worker's samples of the step, {sparse table: torch.unique(ids, return_inverse=True)})."""
    batch = worker_slice(global_batch(cfg, step), [worker], cfg.local_batch_size)
    unique = {}
    for p in cfg.pieces:
        if p.sparse and p.param not in unique:
            unique[p.param] = torch.unique(batch[p.param], return_inverse=True)
    return batch, unique


def in_piece(unique, piece: Piece) -> torch.Tensor:
    """Which of the table's unique ids fall in the piece's rows."""
    ids = unique[piece.param][0]
    return (ids >= piece.start) & (ids < piece.end)


def requested_rows(unique, piece: Piece) -> torch.Tensor:
    """The piece-local rows a pull asks of a sparse piece."""
    return unique[piece.param][0][in_piece(unique, piece)] - piece.start


def assemble(cfg: PsConfig, pieces: dict[int, list[Piece]], values: dict[int, list[torch.Tensor]],
             unique) -> dict[str, nn.Parameter]:
    """The pulled tensors from each server's answer values: a sparse table's unique rows in id order,
    other parameters whole."""
    shapes = cfg.model.param_shapes()
    out: dict[str, torch.Tensor] = {}
    for s, server_pieces in pieces.items():
        for p, v in zip(server_pieces, values[s]):
            if p.sparse:
                full = out.setdefault(p.param, torch.empty(len(unique[p.param][0]), shapes[p.param][1]))
                full[in_piece(unique, p)] = v.reshape(-1, shapes[p.param][1])
            else:
                full = out.setdefault(p.param, torch.empty(shapes[p.param]))
                full[p.start:p.end] = v.reshape((p.end - p.start,) + shapes[p.param][1:])
    return {name: nn.Parameter(t) for name, t in out.items()}


def step_loss(cfg: PsConfig, tensors: dict[str, torch.Tensor], unique, batch) -> torch.Tensor:
    """The worker's loss on its samples (a sparse table's looked-up rows as a small table of their own)."""
    m = cfg.model
    pooled = []
    for t in m.tables:
        ids = unique[t.name][1] if t.name in unique else batch[t.name]
        pooled.append(pool(t, tensors[t.name], ids, sparse=False))
    return loss_of(forward(m, tensors, pooled, batch["dense"]), batch["label"])


def push_values(loss: torch.Tensor, pulled, server_pieces: list[Piece], unique) -> list[torch.Tensor]:
    """A push to one server: the loss, then the gradient of each of its pieces that was pulled."""
    grads = [loss.detach().reshape(1)]
    for p in server_pieces:
        g = pulled[p.param].grad
        grads.append(g[in_piece(unique, p)] if p.sparse else g[p.start:p.end])
    return grads


def apply_update(pieces: list[Piece], data: list[torch.Tensor], optimizers, pushes: list[list[torch.Tensor]],
                 rows: list[list[torch.Tensor | None]], n: int) -> tuple[int, list]:
    """One optimizer step of a server on the pushes' gradients summed and divided by n (each push's
    values after its loss; a sparse piece's rows from ``rows``). Returns the gradient bytes built and
    the gradients applied, per piece (row ids or None, values): what a backup applies to its copy."""
    applied = []
    for i, (piece, d) in enumerate(zip(pieces, data)):
        grads = [values[1 + i] for values in pushes]
        if piece.sparse:
            ids = torch.cat([r[i] for r in rows])
            vals = torch.cat([g.reshape(-1, d.shape[1]) for g in grads]) / n
        else:
            ids, vals = None, (torch.stack(grads).sum(0) / n).reshape(d.shape)
        applied.append((ids, vals))
    return apply_gradients(pieces, data, optimizers, applied), applied


def apply_gradients(pieces: list[Piece], data: list[torch.Tensor], optimizers, grads: list) -> int:
    """One optimizer step with the given gradient of each piece ((row ids, values) of a sparse piece,
    (None, the dense gradient) otherwise); the same inputs give the same weights bit for bit, which is
    what keeps a backup's copy equal to its primary. Returns the gradient bytes built."""
    grad_bytes = 0
    for piece, d, (ids, vals) in zip(pieces, data, grads):
        if piece.sparse:
            d.grad = torch.sparse_coo_tensor(ids.unsqueeze(0), vals.reshape(-1, d.shape[1]), d.shape,
                                             check_invariants=False)
            grad_bytes += vals.numel() * vals.element_size() + ids.numel() * ids.element_size()
        else:
            d.grad = vals.reshape(d.shape)
            grad_bytes += vals.numel() * vals.element_size()
    for opt in optimizers:
        opt.step()
    for d in data:
        d.grad = None
    return grad_bytes
