"""A worker: per step, pull what its batch needs, compute forward and backward, push the gradients.

* pull: from every server, the rows of its sparse tables that this worker's batch looks up (each
  unique id once) and every other piece whole (ps-lite's pull of the keys a worker needs, Li et al.
  2014 section 3);
* forward and backward on those tensors as the reference runs them, the looked-up rows as a small
  table of their own (its gradient is the sparse gradient, one row per unique id);
* push: the gradient of every pulled piece and the local loss, to the server it came from;
* asynchronous (``synchronous: false``): the pull of step k + 1 goes out as soon as step k's
  weights have arrived, before step k is computed, and the push is not waited for: the worker never
  waits on a server's update, and each of its gradients lands on weights that its own previous push
  and the other workers' pushes have changed since (the cost model's staleness of N updates,
  advisor.cost.parameter_server);
* hybrid: the tensors not on servers live on every worker and their gradients are all-reduced over
  a gloo group of the workers only (averaged over the workers in it), then the same optimizer is
  applied locally. When a worker is gone (the scheduler's store says so) the others form a new group
  without it and redo that all-reduce from their own gradients. A worker waits for the sum or that word,
  whichever comes first: a dead member fails the ring at its neighbours only, and a worker whose neighbour
  gave up would otherwise wait out gloo's whole timeout.
* a server that fails (``replicas`` 1, synchronous): its shard is served by its backup from the copy,
  from the step the copy had reached (advisor.executor.ps.server). The worker keeps each server's last
  two steps of messages; when a receive from a server fails it waits for the scheduler's word of the
  takeover, replays to the backup every step from the copy's on (the answers must equal what the failed
  server answered: the copy holds no other weights) and goes on with the backup. After its last push it
  waits until every shard has applied the last step, replaying to a backup that took one over late.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from advisor.executor.ps import wire
from advisor.executor.ps.config import PsConfig
from advisor.executor.ps.layouts import answer_layout, push_layout, request_layout
from advisor.executor.ps.model import init_rows, make_optimizers, state_bytes
from advisor.executor.ps.step_math import assemble, push_values, requested_rows, step_loss, worker_batch
from advisor.executor.ps.server import (POLL_S, adopted_key, done_key, kill_if_asked, left_key, role_tag,
                                        server_left_key)


class SavedBytes:
    """Bytes autograd saves for backward during a forward, by distinct storage, parameters left
    out (what advisor.executor.measure.ActivationTracker counts per micro-batch, without its
    DTensor and checkpoint cases, which a parameter-server worker does not have)."""

    def __init__(self):
        self.by_storage: dict[tuple[int, int], int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter) and not isinstance(t._base, nn.Parameter):
            st = t.untyped_storage()
            self.by_storage[(st.data_ptr(), st.nbytes())] = st.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    @property
    def total(self) -> int:
        return sum(self.by_storage.values())


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Worker:
    def __init__(self, cfg: PsConfig, index: int, pg, store, timeout_s: float):
        self.cfg, self.index, self.pg, self.store, self.timeout_s = cfg, index, pg, store, timeout_s
        m = cfg.model
        self.pieces = {s: cfg.server_pieces(s) for s in range(cfg.servers)}
        torch.sparse.check_sparse_tensor_invariants.disable()   # said explicitly: no warning from torch.optim
        shapes = m.param_shapes()
        self.local = {name: nn.Parameter(init_rows(m, name, 0, shapes[name][0], cfg.seed))
                      for name in cfg.replicated_params()}
        self.sparse_tables = {t.name for t in m.tables if t.sparse}
        self.optimizers = make_optimizers(cfg.optimizer, cfg.learning_rate,
                                          [(p, n in self.sparse_tables) for n, p in self.local.items()])
        self.members = list(range(cfg.workers))
        self.group = None
        self.owner = {s: s for s in range(cfg.servers)}      # the server holding each shard (its rank)
        # shard -> step -> [pull request, its answer's values, the push and its layout]: the last two steps
        self.sent: dict[int, dict[int, list]] = {s: {} for s in range(cfg.servers)}
        self.takeovers: list[dict] = []
        self.abandoned: list = []       # (group, operation, buffer) given up when a member left mid-sum
        self.memory = {"parameters": 0, "gradients": 0, "optimizer": 0, "activations_per_microbatch": 0}

    def run(self) -> dict:
        times, losses = [], []
        if self.local:
            self._form_group()
        ahead = self._pull(0) if not self.cfg.synchronous else None
        in_flight: list = []
        for step in range(self.cfg.steps):
            kill_if_asked("ADVISOR_PS_TEST_KILL_WORKER", self.index, step)
            t0 = time.perf_counter()
            if self.cfg.synchronous:
                losses.append(self._step(step))
            else:
                loss, ahead, in_flight = self._step_async(step, ahead, in_flight)
                losses.append(loss)
            times.append(time.perf_counter() - t0)
        self._wait(in_flight)
        if self.cfg.replicas:
            self._confirm_last_step()
        return {"role": "worker", "index": self.index, "step_times_s": times, "losses": losses,
                "memory_bytes": self.memory, "allreduce_members": self.members if self.local else None,
                "takeovers": self.takeovers}

    # ---- one step
    def _pull(self, step: int):
        """Send the step's pull requests: (sends, counts per server, unique ids, batch)."""
        batch, unique = worker_batch(self.cfg, self.index, step)
        sends, counts = [], {}
        for s, pieces in self.pieces.items():
            ids = [requested_rows(unique, p) for p in pieces if p.sparse]
            counts[s] = [t.numel() for t in ids]
            request = wire.Message(wire.PULL, step, ids, [])
            if self.cfg.replicas:
                self.sent[s][step] = [request, None, None, None]
                self.sent[s].pop(step - 2, None)
            sends += self._send(s, request, request_layout(self.cfg, s))
        return sends, counts, unique, batch

    def _send(self, s: int, msg: wire.Message, layout) -> list:
        """Start sending to the server holding shard s; a server gone is found out by the next receive. Each send
        carries the server it went to, for _wait."""
        host = self.owner[s]
        try:
            works = wire.send(self.pg, host, msg, layout, role_tag(s, host))
        except RuntimeError:
            if not self.cfg.replicas:
                raise
            return []
        return [(work, (buf, host)) for work, buf in works]

    def _wait(self, works: list) -> None:
        """Wait for sends. With replicas a send to a server the scheduler has declared gone is given up on: it was
        never received, and would end only at gloo's timeout (it closes its pair's group then, wire.PairGroups);
        the shard's takeover replays what it carried."""
        if not self.cfg.replicas:
            wire.wait_all(works)
            return
        for work, (buf, host) in works:
            try:
                wire.sent_unless([(work, buf)], lambda host=host: self.store.check([server_left_key(host)]), POLL_S)
            except RuntimeError:
                pass

    def _answers(self, counts, unique, step: int) -> dict[str, nn.Parameter]:
        answers = {}
        for s in self.pieces:
            layout = answer_layout(self.cfg, s, counts[s])
            try:
                answers[s] = wire.receive(self.pg, self.owner[s], layout, role_tag(s, self.owner[s]))
            except RuntimeError:
                if not (self.cfg.replicas and self.cfg.synchronous):
                    raise
                answers[s] = self._take_over(s, step)
            if self.cfg.replicas:
                self.sent[s][step][1] = [v.clone() for v in answers[s].values]
        return assemble(self.cfg, self.pieces, {s: a.values for s, a in answers.items()}, unique)

    # ---- a server gone: its backup serves the shard from its copy
    def _take_over(self, s: int, step: int) -> wire.Message | None:
        """Go on with shard s at the server that took it over: replay every step from the one its copy had
        reached up to ``step`` (each answer checked against the one the failed server gave), then send
        ``step``'s pull and return its answer (None when ``step`` is past the last step)."""
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check([adopted_key(s)]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.index}: server {self.owner[s]} stopped answering and no server "
                                   f"took shard {s} over within {self.timeout_s:g} s")
            time.sleep(POLL_S)
        host, copy_step = (int(x) for x in self.store.get(adopted_key(s)).decode().split(","))
        self.takeovers.append({"shard": s, "server": host, "from_step": copy_step, "at_step": step})
        self.owner[s] = host
        for k in range(copy_step, step + 1):
            if k >= self.cfg.steps:
                return None
            record = self.sent[s].get(k)
            if record is None:
                raise RuntimeError(f"worker {self.index}: server {host} took shard {s} over at step {copy_step}, "
                                   f"but this worker kept its messages only from step {min(self.sent[s])}")
            request, answered, push, push_layout_ = record
            self._wait(self._send(s, request, request_layout(self.cfg, s)))
            tag = role_tag(s, host)
            answer = wire.receive(self.pg, host, answer_layout(self.cfg, s, [t.numel() for t in request.ids]), tag)
            if k == step:
                return answer
            if any(not torch.equal(a, b) for a, b in zip(answer.values, answered)):
                raise RuntimeError(f"worker {self.index}: server {host}'s copy of shard {s} answered step {k} with "
                                   "other weights than the failed server: an update was lost")
            self._wait(self._send(s, push, push_layout_))
        return None

    def _confirm_last_step(self) -> None:
        """Wait until every shard has applied the last step; a shard whose server failed after this
        worker's last push is replayed to its backup."""
        deadline = time.monotonic() + self.timeout_s
        for s in self.pieces:
            while not self.store.check([done_key(s)]):
                if self.owner[s] == s and self.store.check([server_left_key(s)]):
                    self._take_over(s, self.cfg.steps)
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise RuntimeError(f"worker {self.index}: shard {s} did not apply the last step within "
                                       f"{self.timeout_s:g} s")
                time.sleep(POLL_S)

    def _step(self, step: int) -> float:
        sends, counts, unique, batch = self._pull(step)
        pulled = self._answers(counts, unique, step)
        self._wait(sends)
        loss, pushes = self._compute_and_push(step, pulled, counts, unique, batch)
        self._wait(pushes)
        return loss

    def _step_async(self, step: int, ahead, in_flight: list):
        """Step k's weights arrive, step k + 1's pull goes out, step k is computed and pushed; the
        sends of step k - 1 are done by then (each server has answered the pull that followed them)."""
        sends, counts, unique, batch = ahead
        pulled = self._answers(counts, unique, step)
        self._wait(sends + in_flight)
        following = self._pull(step + 1) if step + 1 < self.cfg.steps else None
        loss, pushes = self._compute_and_push(step, pulled, counts, unique, batch)
        return loss, following, pushes

    def _compute_and_push(self, step: int, pulled, counts, unique, batch):
        for p in self.local.values():
            p.grad = None
        saved = SavedBytes()
        with saved.hooks():
            loss = step_loss(self.cfg, {**pulled, **self.local}, unique, batch)
        loss.backward()
        self._measure(pulled, saved)

        pushes = []
        for s, pieces in self.pieces.items():
            grads = push_values(loss, pulled, pieces, unique)
            push, layout = wire.Message(wire.PUSH, step, [], grads), push_layout(self.cfg, s, counts[s])
            if self.cfg.replicas:
                self.sent[s][step][2:] = [push, layout]
            pushes += self._send(s, push, layout)
        if self.local:
            self._update_local(batch)
        self.memory["optimizer"] = max(self.memory["optimizer"], state_bytes(self.optimizers))
        return loss.item(), pushes

    def _measure(self, pulled, saved: SavedBytes) -> None:
        held = list(pulled.values()) + list(self.local.values())
        now = {"parameters": _bytes(held), "gradients": _bytes(p.grad for p in held),
               "activations_per_microbatch": saved.total}
        self.memory.update({k: max(v, self.memory[k]) for k, v in now.items()})

    # ---- hybrid: the replicated tensors
    def _update_local(self, batch) -> None:
        names = list(self.local)
        parts = [self.local[n].grad.reshape(-1) for n in names]
        masks = []
        for n in names:
            if n in self.sparse_tables:        # which rows this worker touched, summed over workers
                masks.append(torch.bincount(batch[n].reshape(-1), minlength=self.local[n].shape[0]).clamp_(max=1).float())
        total, n_workers = self._allreduce(torch.cat(parts + masks))
        offset, mask_offset = 0, sum(p.numel() for p in parts)
        for n in names:
            p = self.local[n]
            grad = total[offset:offset + p.numel()].reshape(p.shape) / n_workers
            offset += p.numel()
            if n in self.sparse_tables:
                touched = total[mask_offset:mask_offset + p.shape[0]].nonzero().reshape(-1)
                mask_offset += p.shape[0]
                grad = torch.sparse_coo_tensor(touched.unsqueeze(0), grad[touched], p.shape, check_invariants=False)
            p.grad = grad
        for opt in self.optimizers:
            opt.step()

    def _form_group(self) -> None:
        if len(self.members) == 1:
            self.group = None
            return
        prefix = "ps/workers/" + "-".join(map(str, self.members)) + "/"
        self.group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, self.store), self.members.index(self.index),
                                           len(self.members), datetime.timedelta(seconds=self.timeout_s))

    def _gone(self) -> list[int]:
        return [w for w in self.members if w != self.index and self.store.check([left_key(w)])]

    def _completed(self, work) -> bool:
        """Wait for ``work`` (True: done, or failed, which its ``wait`` then raises) or for a member of the group to
        be declared gone (False). Gloo's wait with a timeout wakes when the work ends and leaves it running when
        the timeout passes, so the scheduler's news is read every POLL_S at no cost to the sum."""
        while True:
            try:
                work.wait(timeout=datetime.timedelta(seconds=POLL_S))
                return True
            except RuntimeError:
                if work.is_completed():
                    return True
                if self._gone():
                    return False

    def _allreduce(self, flat: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Sum over the live workers and their count; regroup without a worker that is gone."""
        while True:
            gone = self._gone()
            if gone:
                self.members = [w for w in self.members if w not in gone]
                self._form_group()
            if self.group is None:
                return flat, 1
            buf = flat.clone()
            work = self.group.allreduce([buf])
            # wait for the sum or for the news that a member is gone, whichever comes first: a member's death
            # fails the ring at its neighbours only, and a member still waiting on a neighbour that has given up
            # would wait out gloo's whole timeout. The abandoned operation ends on its own, in the old group,
            # which is kept: destroying a group joins its threads, so would wait for that operation.
            if not self._completed(work):
                self.abandoned.append((self.group, work, buf))
                continue
            try:
                work.wait()
                return buf, len(self.members)
            except RuntimeError:
                deadline = time.monotonic() + self.timeout_s
                while not self._gone():
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(POLL_S)
