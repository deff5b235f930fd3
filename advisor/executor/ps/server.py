"""A server: holds its pieces of the server tensors, answers pulls, aggregates pushes, applies the
optimizer (Li et al. 2014, OSDI, sections 3-4).

Synchronous rounds, one per step: (A) answer one pull of every live worker (a sparse table's
requested rows, every other piece whole); (B) take one push of every live worker (the gradients of
exactly those rows and pieces, and its loss), then apply the optimizer once to the average, which
is the gradient of the global batch's mean loss, as one process would compute it. A worker the
scheduler declares gone (store key ps/left/<worker>) is dropped from the round it is missing in and
from every later one: the barrier shrinks and the average is over the workers that pushed.

Asynchronous (Li et al. 2014 section 3.4; ``synchronous: false``): no rounds. Messages are taken
from whichever worker sends next: a pull is answered from the weights as they are, a push is
applied at once, alone, scaled by 1/N of the N live workers (its share of a synchronous average: with
SGD, N fresh pushes move the weights as one synchronous step would; Adam and Adagrad normalize each
update, so there each push is close to a whole step). Each update counts one version; a
push's staleness is the number of updates applied between the pull its gradient was computed from
and itself. The server records the version each pull saw and the order of the pushes it applied,
which is all a single process needs to replay the run (advisor.executor.ps.replay).
"""

from __future__ import annotations

import os
import signal
import time

import torch

from advisor.executor.ps import wire
from advisor.runtime.rank import test_hook
from advisor.executor.ps.config import PsConfig
from advisor.executor.ps.layouts import answer_layout, async_next_kind, requested_counts, server_inbox_layouts
from advisor.executor.ps.model import init_rows, make_optimizers, state_bytes
from advisor.executor.ps.step_math import apply_update

POLL_S = 0.05


def left_key(worker: int) -> str:
    return f"ps/left/{worker}"


class WorkerGone(Exception):
    pass


def kill_if_asked(env_var: str, index: int, step: int) -> None:
    """Tests only: ``<env_var>=index:step`` makes that server or worker die by SIGKILL at that step."""
    want = test_hook(env_var)
    if want and want == f"{index}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


class Server:
    def __init__(self, cfg: PsConfig, index: int, pg, store, timeout_s: float):
        self.cfg, self.index, self.pg, self.store, self.timeout_s = cfg, index, pg, store, timeout_s
        self.pieces = cfg.server_pieces(index)
        torch.sparse.check_sparse_tensor_invariants.disable()   # said explicitly: no warning from torch.optim
        self.data = [init_rows(cfg.model, p.param, p.start, p.end, cfg.seed).requires_grad_() for p in self.pieces]
        self.optimizers = make_optimizers(cfg.optimizer, cfg.learning_rate, [(d, p.sparse) for d, p in zip(self.data, self.pieces)])
        self.worker_ranks = [cfg.servers + w for w in range(cfg.workers)]   # worker w is rank servers + w
        self.live = set(range(cfg.workers))
        self.left: list[dict] = []
        self.gradient_bytes = 0
        self.receive_errors: dict[int, tuple[Exception, float]] = {}     # worker -> (error, when)

    # ---- waiting for a worker, or for the news that it is gone
    def _next(self, pending: set[int], inbox: wire.Inbox, kind: int, step: int) -> tuple[int, wire.Message] | None:
        ranks = {self.cfg.servers + w for w in pending}
        errors = self.receive_errors         # kept across calls: the asynchronous loop calls once per message
        while True:
            got = inbox.next_from(ranks, POLL_S)
            if got is not None:
                rank, item = got
                w = rank - self.cfg.servers
                if isinstance(item, Exception):
                    errors[w] = (item, time.monotonic())
                    ranks.discard(rank)
                else:
                    if kind is not None and (item.kind != kind or item.step != step):
                        raise RuntimeError(f"server {self.index}: worker {w} sent message kind {item.kind} of step "
                                           f"{item.step}, expected kind {kind} of step {step}")
                    return w, item
            for w in list(pending):
                if self.store.check([left_key(w)]):
                    self._drop(w, step, pending)
                    ranks.discard(self.cfg.servers + w)
                elif w in errors and time.monotonic() - errors[w][1] > self.timeout_s:
                    raise RuntimeError(f"server {self.index}: lost worker {w}: {errors[w][0]}")
            if not pending:
                return None

    def _drop(self, w: int, step: int, pending: set[int]) -> None:
        pending.discard(w)
        if w in self.live:
            self.live.discard(w)
            self.left.append({"worker": w, "rank": self.cfg.servers + w, "step": step})

    # ---- one round
    def run(self) -> dict:
        if not self.cfg.synchronous:
            return self.run_async()
        cfg = self.cfg
        inbox = wire.Inbox(self.pg, self.worker_ranks, 2 * cfg.steps, server_inbox_layouts(cfg, self.index))
        times, losses, contributors = [], [], []
        for step in range(cfg.steps):
            self.store.set(f"ps/step/server{self.index}", str(step))
            kill_if_asked("ADVISOR_PS_TEST_KILL_SERVER", self.index, step)
            t0 = time.perf_counter()
            requested = self._serve_pulls(step, inbox)
            pushed = self._take_pushes(step, inbox, requested)
            if not pushed:
                raise RuntimeError(f"server {self.index}: no worker is left at step {step}")
            self._apply(pushed, requested, len(pushed))
            contributors.append(sorted(pushed))
            losses.append(sum(msg.values[0].item() for msg in pushed.values()) / len(pushed))
            times.append(time.perf_counter() - t0)
        return {"role": "server", "index": self.index, "pieces": len(self.pieces), "step_times_s": times,
                "losses": losses, "contributors": contributors, "left": self.left,
                "memory_bytes": {"parameters": sum(d.numel() * d.element_size() for d in self.data),
                                 "optimizer": state_bytes(self.optimizers), "gradients": self.gradient_bytes}}

    def _each(self, pending: set[int], inbox: wire.Inbox, kind: int, step: int):
        """(worker, message) of this step's kind from each pending worker as it arrives, until every
        one has sent or is known to be gone."""
        while pending:
            got = self._next(pending, inbox, kind, step)
            if got is None:
                return
            pending.discard(got[0])
            yield got

    def _serve_pulls(self, step: int, inbox: wire.Inbox) -> dict[int, list[torch.Tensor]]:
        requested, sends = {}, []
        for w, msg in self._each(set(self.live), inbox, wire.PULL, step):
            rows = iter(msg.ids)
            requested[w] = [next(rows) if p.sparse else None for p in self.pieces]
            values = [d.detach()[r] if r is not None else d.detach() for d, r in zip(self.data, requested[w])]
            layout = answer_layout(self.cfg, self.index, requested_counts(msg))
            sends.append((w, self._answer(w, wire.Message(wire.PULL, step, [], values), layout)))
        for w, works in sends:
            try:
                wire.wait_all(works)
            except RuntimeError:
                pass                    # a worker gone mid-answer is dropped when its push is missed
        return requested

    def _take_pushes(self, step: int, inbox: wire.Inbox, requested) -> dict[int, wire.Message]:
        pending = {w for w in self.live if w in requested}
        for w in set(self.live) - pending:      # pulled nothing this step: gone before the round
            self._drop(w, step, set())
        return dict(self._each(pending, inbox, wire.PUSH, step))

    def _apply(self, pushed: dict, requested: dict, n: int) -> None:
        """Apply the optimizer once to the pushes' gradients summed and divided by n (a sparse
        piece's rows are those ``requested`` of the same key)."""
        grad_bytes = apply_update(self.pieces, self.data, self.optimizers, [m.values for m in pushed.values()],
                                  [requested[key] for key in pushed], n)
        self.gradient_bytes = max(self.gradient_bytes, grad_bytes)

    # ---- asynchronous: no rounds
    def run_async(self) -> dict:
        cfg = self.cfg
        inbox = wire.Inbox(self.pg, self.worker_ranks, 2 * cfg.steps, server_inbox_layouts(cfg, self.index))
        counts = {w: [0, 0] for w in range(cfg.workers)}           # pulls, pushes taken
        requested, seen = {}, {}                                   # (worker, step) -> rows, version pulled
        answers: dict[int, list] = {}                              # the answer in flight to each worker
        pulls, applied, staleness, losses = [], [], [], []
        times = [0.0] * cfg.steps               # handling the messages of each step, summed
        version, checked, reached = 0, time.monotonic(), -1
        while True:
            if time.monotonic() - checked > POLL_S:     # a worker gone no longer counts in the 1/N scaling
                checked = time.monotonic()
                for w in [w for w in self.live if self.store.check([left_key(w)])]:
                    self._drop(w, None, set())
            pending = {w for w in self.live if counts[w][1] < cfg.steps}
            if not pending:
                break
            got = self._next(pending, inbox, None, None)
            if got is None:
                continue
            w, msg = got
            kind = async_next_kind(counts[w][0], counts[w][1], cfg.steps)
            step = counts[w][0] if kind == wire.PULL else counts[w][1]
            if msg.kind != kind or msg.step != step:
                raise RuntimeError(f"server {self.index}: worker {w} sent message kind {msg.kind} of step {msg.step}, "
                                   f"expected kind {kind} of step {step}")
            t0 = time.perf_counter()
            if kind == wire.PULL:
                if step > reached:
                    reached = step
                    kill_if_asked("ADVISOR_PS_TEST_KILL_SERVER", self.index, step)
                    self.store.set(f"ps/step/server{self.index}", str(step))
                self._finish_answer(answers.pop(w, None))
                rows = iter(msg.ids)        # copied: the message's views hold its whole receive buffer
                requested[(w, step)] = [next(rows).clone() if p.sparse else None for p in self.pieces]
                values = [d.detach()[r] if r is not None else d.detach()       # sending packs a copy
                          for d, r in zip(self.data, requested[(w, step)])]
                layout = answer_layout(cfg, self.index, requested_counts(msg))
                answers[w] = self._answer(w, wire.Message(wire.PULL, step, [], values), layout)
                seen[(w, step)] = version
                pulls.append([w, step, version])
                counts[w][0] += 1
            else:
                n = len(self.live)
                self._apply({(w, step): msg}, requested, n)
                del requested[(w, step)]
                staleness.append(version - seen[(w, step)])
                applied.append([w, step, n])
                losses.append(msg.values[0].item())
                version += 1
                counts[w][1] += 1
            times[step] += time.perf_counter() - t0
        for works in answers.values():
            self._finish_answer(works)
        for x in self.left:             # gone after this many of its pushes were applied
            x["step"] = counts[x["worker"]][1] if x["step"] is None else x["step"]
        per_step = [sorted(w for w, s, _ in applied if s == step) for step in range(cfg.steps)]
        return {"role": "server", "index": self.index, "pieces": len(self.pieces), "step_times_s": times,
                "losses": losses, "contributors": per_step, "left": self.left,
                "async": {"pulls": pulls, "applied": applied, "staleness": staleness},
                "memory_bytes": {"parameters": sum(d.numel() * d.element_size() for d in self.data),
                                 "optimizer": state_bytes(self.optimizers), "gradients": self.gradient_bytes}}

    def _answer(self, w: int, msg: wire.Message, layout) -> list:
        """Start sending an answer; a worker that died after asking gets none (the scheduler then
        declares it gone and its push is not waited for)."""
        try:
            return wire.send(self.pg, self.cfg.servers + w, msg, layout)
        except RuntimeError:
            return []

    @staticmethod
    def _finish_answer(works) -> None:
        """Wait for an answer sent earlier (its worker has received it by the time it sends again)."""
        if works:
            try:
                wire.wait_all(works)
            except RuntimeError:
                pass                    # a worker gone mid-answer is dropped when its messages stop
