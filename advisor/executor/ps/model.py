"""The recommendation network as a function of its tensors, its data, initialization, optimizers,
and the single-process reference run that a parameter-server run must match.

The network is DLRM's (Naumov et al. 2019, arXiv 1906.00091, section 2; facebookresearch/dlrm
dlrm_s_pytorch.py): dense features -> bottom MLP (Linear + ReLU each); every table looked up
``lookups`` times per sample and pooled by sum (EmbeddingBag mode "sum") or kept side by side
(concat, Wide&Deep's fields); interaction ``dot`` (pairwise dot products of the bottom output and
the pooled vectors, strictly lower triangle, after the bottom output) or ``cat``; top MLP (ReLU
between layers) to one logit; binary cross-entropy on it.

Parameters are made from the seed alone, row block by row block, so a server can make its shard
without the rest of the table and get the same numbers as the reference (DLRM's initialization:
tables uniform in +-sqrt(1/rows), weights normal with std sqrt(2/(fan_in+fan_out)), biases normal
with std sqrt(1/fan_out); dlrm_s_pytorch.py create_emb and create_mlp).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F

from advisor.executor.ps.config import PsConfig, RecModel

INIT_BLOCK_ROWS = 4096


def init_rows(model: RecModel, param: str, start: int, end: int, seed: int) -> torch.Tensor:
    """Rows [start, end) of a parameter's initial value (module doc)."""
    shape = model.param_shapes()[param]
    rest = shape[1:]
    width = math.prod(rest) if rest else 1
    if param.endswith(".weight"):
        fan_out, fan_in = shape
        std, uniform = math.sqrt(2.0 / (fan_in + fan_out)), False
    elif param.endswith(".bias"):
        std, uniform = math.sqrt(1.0 / shape[0]), False
    else:
        std, uniform = math.sqrt(1.0 / shape[0]), True     # a table: the bound of the uniform
    out = []
    for block in range(start // INIT_BLOCK_ROWS, (end - 1) // INIT_BLOCK_ROWS + 1 if end > start else 0):
        g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(param.encode()) * 7919 + block) % 2 ** 63)
        b0 = block * INIT_BLOCK_ROWS
        rows = min(INIT_BLOCK_ROWS, shape[0] - b0)
        values = (torch.rand(rows, width, generator=g) * 2 - 1) * std if uniform else torch.randn(rows, width, generator=g) * std
        out.append(values[max(start, b0) - b0:min(end, b0 + rows) - b0])
    data = torch.cat(out) if out else torch.empty(0, width)
    return data.reshape((end - start,) + rest).contiguous()


def global_batch(cfg: PsConfig, step: int) -> dict[str, torch.Tensor]:
    """The step's global batch: dense features, one (B, lookups) id tensor per table, 0/1 labels."""
    m, b = cfg.model, cfg.global_batch_size
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    batch = {"dense": torch.randn(b, m.dense_features, generator=g), "label": torch.randint(0, 2, (b,), generator=g).float()}
    for t in m.tables:
        batch[t.name] = torch.randint(0, t.rows, (b, t.lookups), generator=g)
    return batch


def worker_slice(batch: dict[str, torch.Tensor], workers: list[int], per_worker: int) -> dict[str, torch.Tensor]:
    """The samples of the given workers (worker w trains samples [w b, (w + 1) b) of every step)."""
    idx = torch.cat([torch.arange(w * per_worker, (w + 1) * per_worker) for w in workers])
    return {k: v[idx] for k, v in batch.items()}


def pool(table, weight: torch.Tensor, ids: torch.Tensor, sparse: bool) -> torch.Tensor:
    """(B, output_width): the table's rows for ``ids`` (B, lookups), summed or side by side."""
    if table.pooling == "sum":
        return F.embedding_bag(ids, weight, mode="sum", sparse=sparse)
    return F.embedding(ids, weight, sparse=sparse).reshape(ids.shape[0], -1)


def forward(model: RecModel, params: dict[str, torch.Tensor], pooled: list[torch.Tensor],
            dense: torch.Tensor) -> torch.Tensor:
    """Logits (B,) from the towers' parameters, the pooled tables (in table order), the dense features."""
    x = dense
    layers = model.layers()
    bottom = [name for name, _, _ in layers if name.startswith("bottom_mlp_")]
    top = [name for name, _, _ in layers if name.startswith("top_mlp_")]
    for name in bottom:
        x = F.relu(F.linear(x, params[f"{name}.weight"], params[f"{name}.bias"]))
    front = [x] if model.bottom_width else []
    if model.interaction == "dot":
        vectors = torch.stack(front + pooled, dim=1)                      # (B, F, d)
        products = torch.bmm(vectors, vectors.transpose(1, 2))
        li, lj = torch.tril_indices(vectors.shape[1], vectors.shape[1], offset=-1)
        z = torch.cat(front + [products[:, li, lj]], dim=1)
    else:
        z = torch.cat(front + pooled, dim=1)
    for i, name in enumerate(top):
        z = F.linear(z, params[f"{name}.weight"], params[f"{name}.bias"])
        if i < len(top) - 1:
            z = F.relu(z)
    return z.squeeze(1)


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, labels)


def make_optimizers(kind: str, lr: float, params: list[tuple[torch.Tensor, bool]]) -> list[torch.optim.Optimizer]:
    """One set of torch optimizers for (tensor, has sparse gradients) pairs. SGD and Adagrad take
    sparse gradients; Adam and AdamW use SparseAdam for sparse tables (lazy: only the rows a step
    touches are updated, as a parameter server updates them)."""
    dense = [p for p, sparse in params if not sparse]
    sparse = [p for p, s in params if s]
    everything = dense + sparse
    if kind == "sgd":
        return [torch.optim.SGD(everything, lr=lr)] if everything else []
    if kind == "adagrad":
        return [torch.optim.Adagrad(everything, lr=lr)] if everything else []
    dense_cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    out: list[torch.optim.Optimizer] = []
    if dense:
        out.append(dense_cls(dense, lr=lr))
    if sparse:
        out.append(torch.optim.SparseAdam(sparse, lr=lr))
    return out


def state_bytes(optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of optimizer state tensors (step counters, 0-d, left out)."""
    return sum(v.numel() * v.element_size() for opt in optimizers for st in opt.state.values()
               for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)


def run_reference(cfg: PsConfig, contributors: list[list[int]] | None = None) -> dict[str, list[float]]:
    """The same model, data, seed and optimizer in one process on the global batch of every step
    (or, per step, only the samples of the workers that contributed to it)."""
    m = cfg.model
    torch.sparse.check_sparse_tensor_invariants.disable()   # said explicitly: no warning from torch.optim
    params = {name: init_rows(m, name, 0, shape[0], cfg.seed).requires_grad_()
              for name, shape in m.param_shapes().items()}
    sparse = {t.name: t.sparse for t in m.tables}
    opts = make_optimizers(cfg.optimizer, cfg.learning_rate, [(p, sparse.get(n, False)) for n, p in params.items()])
    losses = []
    for step in range(cfg.steps):
        workers = contributors[step] if contributors is not None else list(range(cfg.workers))
        batch = worker_slice(global_batch(cfg, step), workers, cfg.local_batch_size)
        pooled = [pool(t, params[t.name], batch[t.name], t.sparse) for t in m.tables]
        loss = loss_of(forward(m, params, pooled, batch["dense"]), batch["label"])
        for p in params.values():
            p.grad = None
        loss.backward()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
    return {"losses": losses}
