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
from advisor.executor.ps.layouts import (answer_layout, async_next_kind, replica_layout, requested_counts,
                                         server_inbox_layouts)
from advisor.executor.ps.model import init_rows, make_optimizers, state_bytes
from advisor.executor.ps.step_math import apply_gradients, apply_update

POLL_S = 0.05


def left_key(worker: int) -> str:
    return f"ps/left/{worker}"


def step_key(server: int) -> str:
    """The step a server's own shard is in (the scheduler names it when the server stops or hangs)."""
    return f"ps/step/server{server}"


def server_left_key(server: int) -> str:
    """Set by the scheduler when a server is gone and its backup is to take its shard over."""
    return f"ps/server_left/{server}"


def adopted_key(shard: int) -> str:
    """Set by the backup that took a shard over: "<its index>,<the step its copy had reached>"."""
    return f"ps/adopted/{shard}"


def done_key(shard: int) -> str:
    """Set by whichever server holds a shard once it has applied every step."""
    return f"ps/done/{shard}"


def role_tag(shard: int, host: int) -> int:
    """The tag of a shard's messages between a worker and the server holding it: the server's own shard on
    wire.TAG, a shard taken over on a tag of its own (the pair of ranks already carries the host's own)."""
    return wire.TAG if shard == host else 1 + shard


class WorkerGone(Exception):
    pass


def kill_if_asked(env_var: str, index: int, step: int) -> None:
    """Tests only: ``<env_var>=index:step`` makes that server or worker die by SIGKILL at that step."""
    want = test_hook(env_var)
    if want and want == f"{index}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


class Shard:
    """One server's pieces of the server tensors, their optimizer, and how many steps it has applied."""

    def __init__(self, cfg: PsConfig, index: int):
        self.index = index
        self.pieces = cfg.server_pieces(index)
        self.data = [init_rows(cfg.model, p.param, p.start, p.end, cfg.seed).requires_grad_() for p in self.pieces]
        self.optimizers = make_optimizers(cfg.optimizer, cfg.learning_rate,
                                          [(d, p.sparse) for d, p in zip(self.data, self.pieces)])
        self.applied = 0
        self.gradient_bytes = 0

    def parameter_bytes(self) -> int:
        return sum(d.numel() * d.element_size() for d in self.data)


class _Round:
    """A synchronous round of one shard: the pulls still awaited, what each worker asked for, the pushes."""

    def __init__(self, step: int, live: set[int]):
        self.step = step
        self.pulls = set(live)          # workers whose pull is awaited
        self.awaited: set[int] = set()  # workers that pulled and whose push is awaited
        self.requested: dict[int, list] = {}
        self.pushed: dict[int, wire.Message] = {}
        self.t0 = time.perf_counter()

    def complete(self) -> bool:
        return not self.pulls and not self.awaited


class Server:
    def __init__(self, cfg: PsConfig, index: int, pg, store, timeout_s: float):
        self.cfg, self.index, self.pg, self.store, self.timeout_s = cfg, index, pg, store, timeout_s
        torch.sparse.check_sparse_tensor_invariants.disable()   # said explicitly: no warning from torch.optim
        self.own = Shard(cfg, index)
        self.pieces, self.data, self.optimizers = self.own.pieces, self.own.data, self.own.optimizers
        self.worker_ranks = [cfg.servers + w for w in range(cfg.workers)]   # worker w is rank servers + w
        self.live = set(range(cfg.workers))
        self.left: list[dict] = []
        self.gradient_bytes = 0
        self.receive_errors: dict[int, tuple[Exception, float]] = {}     # worker -> (error, when)

    # ---- waiting for a worker, or for the news that it is gone (asynchronous runs)
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

    # ---- synchronous rounds, one per step and shard
    def run(self) -> dict:
        """Serve this server's shard (and, with replicas, keep the copy of the previous server's and take
        it over if that server fails) until every shard it holds has applied every step. Each shard's
        rounds run on their own: a message of a later step than its shard's round waits for it."""
        if not self.cfg.synchronous:
            return self.run_async()
        cfg = self.cfg
        self.box = wire.Mailbox()
        for rank in self.worker_ranks:
            self.box.listen(self.pg, rank, wire.TAG, 2 * cfg.steps, server_inbox_layouts(cfg, self.index), self.index)
        self.hosted: dict[int, Shard] = {self.index: self.own}
        self.rounds: dict[int, _Round] = {}
        self.held: dict[int, list] = {self.index: []}
        self.times, self.losses, self.contributors = [], [], []
        self.adopted: list[dict] = []
        self.replication = []                  # sends of the applied updates to the backup, in flight
        self.backup_gone = False
        self.primary = self.copy = None
        self.primary_closed = False
        self.outgoing: list = []               # answers in flight (work, buffer)
        self.checked = time.monotonic()        # when the scheduler's store was last read
        if cfg.replicas:
            self.primary = (self.index - 1) % cfg.servers
            self.copy = Shard(cfg, self.primary)       # initialised as the primary initialises its shard
            self.box.listen(self.pg, self.primary, wire.TAG, cfg.steps,
                            lambda _peer, _previous: replica_layout(cfg, self.primary), "copy")
        self._start_round(self.index)
        while not self._finished():
            self._poll()
        if not self._replication_sent():
            self.backup_gone = True
        for works in self.outgoing:
            self._finish_answer([works])
        held_bytes = [sh for sh in (self.own, self.copy) if sh is not None]
        return {"role": "server", "index": self.index, "pieces": len(self.own.pieces), "step_times_s": self.times,
                "losses": self.losses, "contributors": self.contributors, "left": self.left,
                "adopted": self.adopted,
                "memory_bytes": {"parameters": sum(sh.parameter_bytes() for sh in held_bytes),
                                 "optimizer": sum(state_bytes(sh.optimizers) for sh in held_bytes),
                                 "gradients": max(sh.gradient_bytes for sh in held_bytes)}}

    def _finished(self) -> bool:
        """Every shard held has applied every step, and the primary whose copy this server keeps has too (until
        then this server may have to take it over)."""
        if any(sh.applied < self.cfg.steps for sh in self.hosted.values()):
            return False
        return self.primary is None or self.primary in self.hosted or self.store.check([done_key(self.primary)])

    def _start_round(self, shard: int) -> None:
        sh = self.hosted[shard]
        if sh.applied >= self.cfg.steps:
            self.store.set(done_key(shard), str(self.index))
            return
        if shard == self.index:
            self.store.set(step_key(self.index), str(sh.applied))
            self._die_if_asked("ADVISOR_PS_TEST_KILL_SERVER", sh.applied)
        self.rounds[shard] = _Round(sh.applied, self.live)
        for key, peer, msg in self.held.pop(shard, []):     # messages of this step that came early
            self._take(key, peer, msg)
        self.held.setdefault(shard, [])
        self._finish_if_complete(shard)

    def _poll(self) -> None:
        """Take the next message; between messages, and at least every POLL_S, read the scheduler's news."""
        self.outgoing = [(work, buf) for work, buf in self.outgoing if not work.is_completed()]
        got = self.box.get(POLL_S)
        if got is not None:
            self._take(*got)
            if time.monotonic() - self.checked < POLL_S:
                return
        self.checked = time.monotonic()
        for w in list(self.live):
            if self.store.check([left_key(w)]):
                self._drop_everywhere(w)
            elif w in self.receive_errors and time.monotonic() - self.receive_errors[w][1] > self.timeout_s:
                raise RuntimeError(f"server {self.index}: lost worker {w}: {self.receive_errors[w][0]}")
        if (self.primary is not None and self.primary not in self.hosted and self.primary_closed
                and self.store.check([server_left_key(self.primary)])):
            self._take_over()

    def _take(self, key, peer: int, item) -> None:
        if key == "copy":
            if isinstance(item, Exception):
                self.primary_closed = True      # every update it sent is in the queue before this
                return
            if item.step != self.copy.applied:
                raise RuntimeError(f"server {self.index}: server {self.primary}'s update of step {item.step} "
                                   f"came when its copy had applied {self.copy.applied} steps")
            ids = iter(item.ids)
            grads = [(next(ids) if p.sparse else None, v) for p, v in zip(self.copy.pieces, item.values)]
            apply_gradients(self.copy.pieces, self.copy.data, self.copy.optimizers, grads)
            self.copy.applied += 1
            return
        w = peer - self.cfg.servers
        if isinstance(item, Exception):
            self.receive_errors.setdefault(w, (item, time.monotonic()))
            return
        rnd = self.rounds.get(key)
        if rnd is None or item.step > rnd.step:
            self.held.setdefault(key, []).append((key, peer, item))
            return
        if item.step < rnd.step:
            raise RuntimeError(f"server {self.index}: worker {w} sent a message of step {item.step} for shard {key}, "
                               f"whose round is at step {rnd.step}")
        if item.kind == wire.PULL and w in rnd.pulls:
            rnd.pulls.discard(w)
            rnd.awaited.add(w)
            self._answer_pull(key, w, item)
        elif item.kind == wire.PUSH and w in rnd.awaited:
            rnd.awaited.discard(w)
            rnd.pushed[w] = item
        elif w in self.live:
            raise RuntimeError(f"server {self.index}: worker {w} sent message kind {item.kind} of step {item.step} "
                               f"for shard {key} out of turn")
        self._finish_if_complete(key)

    def _answer_pull(self, shard: int, w: int, msg: wire.Message) -> None:
        sh, rnd = self.hosted[shard], self.rounds[shard]
        rows = iter(msg.ids)                # copied: the message's views hold its whole receive buffer
        rnd.requested[w] = [next(rows).clone() if p.sparse else None for p in sh.pieces]
        values = [d.detach()[r] if r is not None else d.detach() for d, r in zip(sh.data, rnd.requested[w])]
        layout = answer_layout(self.cfg, shard, requested_counts(msg))
        # not waited for here: a worker takes its answers one server after another, and one that waits for a
        # failed server's shard to be taken over takes this answer only after that (which may be this server's)
        self.outgoing += self._answer(w, wire.Message(wire.PULL, rnd.step, [], values), layout,
                                      role_tag(shard, self.index))

    def _drop_everywhere(self, w: int) -> None:
        self.live.discard(w)
        step = self.rounds[self.index].step if self.index in self.rounds else self.own.applied
        self.left.append({"worker": w, "rank": self.cfg.servers + w, "step": step})
        for shard, rnd in list(self.rounds.items()):
            rnd.pulls.discard(w)
            rnd.awaited.discard(w)
            rnd.pushed.pop(w, None)
            self._finish_if_complete(shard)

    def _finish_if_complete(self, shard: int) -> None:
        rnd = self.rounds.get(shard)
        if rnd is None or not rnd.complete():
            return
        if not rnd.pushed:
            raise RuntimeError(f"server {self.index}: no worker is left at step {rnd.step}")
        sh = self.hosted[shard]
        pushed = dict(sorted(rnd.pushed.items()))
        grad_bytes, applied = apply_update(sh.pieces, sh.data, sh.optimizers, [m.values for m in pushed.values()],
                                           [rnd.requested[w] for w in pushed], len(pushed))
        sh.gradient_bytes = max(sh.gradient_bytes, grad_bytes)
        if shard == self.index:
            self._die_if_asked("ADVISOR_PS_TEST_KILL_SERVER_UNFORWARDED", rnd.step)
            self._replicate(rnd.step, applied)
            self.contributors.append(sorted(pushed))
            self.losses.append(sum(m.values[0].item() for m in pushed.values()) / len(pushed))
            self.times.append(time.perf_counter() - rnd.t0)
        else:
            self.adopted[-1]["contributors"].append(sorted(pushed))
        sh.applied += 1
        del self.rounds[shard]
        self._start_round(shard)

    # ---- replication and takeover (Li et al. 2014, OSDI, section 4.3)
    def _replicate(self, step: int, applied: list) -> None:
        """Forward the update just applied to this server's backup, which applies it to its copy."""
        if not self.cfg.replicas or self.backup_gone:
            return
        backup = self._backup
        if self.store.check([server_left_key(backup)]):
            self.backup_gone = True
            return
        if not self._replication_sent():
            self.backup_gone = True
            return
        try:
            ids = [i for i, _ in applied if i is not None]
            self.replication = wire.send(self.pg, backup, wire.Message(wire.REPLICA, step, ids, [v for _, v in applied]),
                                         replica_layout(self.cfg, self.index))
        except RuntimeError:
            self.backup_gone = True     # its copy is gone with it; this shard keeps training without one

    def _die_if_asked(self, env_var: str, step: int) -> None:
        """Tests only: die as kill_if_asked says, once the update already forwarded to the backup has reached it,
        so that a test knows which step the copy holds. Killed with that send in flight, the copy was one step
        behind or not, by chance (a CI run under load: taken over from step 1 where the test expected 2)."""
        if test_hook(env_var) == f"{self.index}:{step}":
            self._replication_sent()
            kill_if_asked(env_var, self.index, step)

    @property
    def _backup(self) -> int:
        """The server keeping this server's copy (the next one; Li et al. 2014, section 4.3)."""
        return (self.index + 1) % self.cfg.servers

    def _replication_sent(self) -> bool:
        """Wait for the update in flight to the backup (True), or for its failure or the scheduler's word that the
        backup is gone (False): a send to a backup that was killed waits out gloo's whole timeout (it did, under
        load: the run finished 60 s after the backup died), and cannot be polled (wire.sent_unless)."""
        try:
            return wire.sent_unless(self.replication, lambda: self.store.check([server_left_key(self._backup)]),
                                    POLL_S)
        except RuntimeError:
            return False

    def _take_over(self) -> None:
        """The primary is gone (the scheduler says so) and every update it forwarded has been applied to the
        copy: serve its shard from the copy, from the step the copy has reached; the workers replay that
        step to this server (advisor.executor.ps.worker)."""
        cfg, shard = self.cfg, self.primary
        self.hosted[shard] = self.copy
        for rank in sorted(self.cfg.servers + w for w in self.live):
            self.box.listen(self.pg, rank, role_tag(shard, self.index), 2 * (cfg.steps - self.copy.applied),
                            server_inbox_layouts(cfg, shard), shard)
        self.adopted.append({"server": shard, "from_step": self.copy.applied, "contributors": []})
        self.store.set(adopted_key(shard), f"{self.index},{self.copy.applied}")
        self._start_round(shard)

    def _apply(self, pushed: dict, requested: dict, n: int) -> None:
        """Apply the optimizer once to the pushes' gradients summed and divided by n (a sparse
        piece's rows are those ``requested`` of the same key)."""
        grad_bytes, _ = apply_update(self.pieces, self.data, self.optimizers, [m.values for m in pushed.values()],
                                     [requested[key] for key in pushed], n)
        self.gradient_bytes = max(self.gradient_bytes, grad_bytes)

    def _answer(self, w: int, msg: wire.Message, layout, tag: int = wire.TAG) -> list:
        """Start sending an answer; a worker that died after asking gets none (the scheduler then
        declares it gone and its push is not waited for)."""
        try:
            return wire.send(self.pg, self.cfg.servers + w, msg, layout, tag)
        except RuntimeError:
            return []

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
                    self.store.set(step_key(self.index), str(step))
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

    @staticmethod
    def _finish_answer(works) -> None:
        """Wait for an answer sent earlier (its worker has received it by the time it sends again)."""
        if works:
            try:
                wire.wait_all(works)
            except RuntimeError:
                pass                    # a worker gone mid-answer is dropped when its messages stop
