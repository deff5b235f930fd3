"""One pipeline stage of supernet training (``python -m advisor.executor.supernet.worker``), started by
advisor.executor.supernet.run once per rank: it replays its stage's actions in the order the NASPipe
schedule gives (advisor.cost.naspipe), receiving activations and gradients by subnet-numbered tags.

Sends are non-blocking; a receive names its subnet, so messages may arrive in any order. The order
is deadlock-free: every action's inputs come from actions that the schedule ran earlier.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from advisor.runtime.rank import mark_ready, run_spec_rank, write_result

# what the rank imports, for the rank starter to import once before it forks the ranks (advisor.runtime.starter)
PRELOAD = ("torch", "torch.distributed", "advisor.executor.supernet.model")


def _stage(spec: dict, rank: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from advisor.executor.supernet.model import NetShape, Supernet, batch, freeze_ends, sgd

    shape = NetShape.from_dict(spec["shape"])
    bounds, choices, seed, lr = spec["bounds"], spec["choices"], spec["seed"], spec["lr"]
    train_shared = spec["train_shared"]
    p = len(bounds) - 1
    lo, hi, first, last = bounds[rank], bounds[rank + 1], rank == 0, rank == p - 1
    torch.set_num_threads(1)
    net = Supernet(shape, seed)
    freeze_ends(net, train_shared)
    saved: dict[int, tuple] = {}
    sends, losses = [], {}
    act_shape = (shape.batch, shape.seq, shape.hidden)
    start = time.perf_counter()
    for kind, j in spec["orders"][rank]:
        choice = choices[j]
        if kind == "F":
            if first:
                x, _ = batch(shape, seed, j)
            else:
                x = torch.empty(act_shape)
                dist.recv(x, src=rank - 1, tag=2 * j)
                x.requires_grad_(True)
            y = net.run(x, choice, lo, hi, first, last, batch(shape, seed, j)[1] if last else None)
            saved[j] = (x, y)
            if last:
                losses[j] = y.item()
            else:
                sends.append(dist.isend(y.detach().contiguous(), dst=rank + 1, tag=2 * j))
        else:
            x, y = saved.pop(j)
            if last:
                y.backward()
            else:
                grad = torch.empty(act_shape)
                dist.recv(grad, src=rank + 1, tag=2 * j + 1)
                y.backward(grad)
            if not first:
                sends.append(dist.isend(x.grad.contiguous(), dst=rank - 1, tag=2 * j + 1))
            sgd(net.used(choice, lo, hi) + (net.ends(first, last) if train_shared else []), lr)
    for handle in sends:
        handle.wait()
    seconds = time.perf_counter() - start
    write_result(out / f"rank{rank}.json", {"rank": rank, "losses": losses, "seconds": seconds})


def _rank(spec: dict, out: Path, rank: int) -> None:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(os.environ.get("ADVISOR_EXECUTOR_PG_TIMEOUT_S", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    mark_ready(out, rank)
    _stage(spec, rank, out)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> NoReturn:
    run_spec_rank("python -m advisor.executor.supernet.worker", _rank, argv)


if __name__ == "__main__":
    sys.exit(main())
