"""Point-to-point messages between a worker and a server over a gloo process group.

A message is ONE gloo transfer: a byte buffer holding a header (int64: kind, step, the length of
each id and value piece), the id pieces (int64) and the value pieces (float32), each piece in a
slot of a fixed capacity. Both sides know the capacities (a ``Layout``) before the transfer, from
the configuration and the messages already exchanged: a pull request carries at most the rows a
worker's batch can look up in each sparse piece; the answer and the push carry exactly the rows
requested. The header says how much of each slot is used.

Why one transfer: gloo matches a receive with a send of the same size, so a message of several
transfers (a header announcing the sizes, then the pieces) needs one rendezvous per transfer.
Measured on this project's 2-core machine (PyTorch 2.13, gloo over loopback) with 2 servers and 2
workers exchanging 2 KiB messages: a round of pull request, answer and push took a median 12 ms with
two or three transfers per message and 0.7-2.4 ms with one (a whole wide-deep-criteo --tiny step of
the executor, 2 + 2, went from about 10 ms to about 5 ms).

Gloo's point-to-point receive cannot be polled or abandoned (a wait that times out closes the
pair), so a server receives from each worker on a thread of its own (``Inbox``) that blocks on
that worker only; the server's main thread reads the inbox and can thus stop waiting for a worker
the scheduler has declared gone. A receive from a process that died ends at once with gloo's
"Connection closed by peer" error: the inbox hands that error on.

Each pair of roles that talk has a gloo process group of its own (``PairGroups``): when a send to a dead peer
reaches gloo's timeout, gloo closes every pair of that send's process group ("Application timeout caused pair
closure"). In one group of all roles that closed the live pairs too (a takeover under load once ended so: "lost
worker 0: Application timeout caused pair closure"); a group per pair closes only the dead peer's.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

PULL, PUSH, REPLICA = 0, 1, 2
TAG = 0
ID_BYTES, VALUE_BYTES = 8, 4


@dataclass
class Message:
    kind: int
    step: int
    ids: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass(frozen=True)
class Layout:
    """Capacity (elements) of each id piece and each value piece of a message."""

    ids: tuple[int, ...] = ()
    values: tuple[int, ...] = ()

    @property
    def header_len(self) -> int:
        return 2 + len(self.ids) + len(self.values)

    @property
    def nbytes(self) -> int:
        return ID_BYTES * (self.header_len + sum(self.ids)) + VALUE_BYTES * sum(self.values)


def pack(msg: Message, layout: Layout) -> torch.Tensor:
    """The message as one byte buffer of ``layout.nbytes``; a piece longer than its slot is refused."""
    if len(msg.ids) != len(layout.ids) or len(msg.values) != len(layout.values):
        raise ValueError(f"a message of {len(msg.ids)} id and {len(msg.values)} value pieces does not match its "
                         f"layout of {len(layout.ids)} and {len(layout.values)}")
    ids = [t.reshape(-1).to(torch.int64) for t in msg.ids]
    values = [t.detach().reshape(-1).to(torch.float32) for t in msg.values]
    for t, cap in zip(ids + values, layout.ids + layout.values):
        if t.numel() > cap:
            raise ValueError(f"a message piece of {t.numel()} elements exceeds its slot of {cap}")
    buf = torch.zeros(layout.nbytes, dtype=torch.uint8)
    header = torch.tensor([msg.kind, msg.step] + [t.numel() for t in ids + values], dtype=torch.int64)
    offset = _put(buf, 0, header, ID_BYTES * layout.header_len)
    for t, cap in zip(ids, layout.ids):
        offset = _put(buf, offset, t, ID_BYTES * cap)
    for t, cap in zip(values, layout.values):
        offset = _put(buf, offset, t, VALUE_BYTES * cap)
    return buf


def _put(buf: torch.Tensor, offset: int, t: torch.Tensor, slot_bytes: int) -> int:
    raw = t.contiguous().view(torch.uint8)
    buf[offset:offset + raw.numel()] = raw
    return offset + slot_bytes


def unpack(buf: torch.Tensor, layout: Layout) -> Message:
    header = buf[:ID_BYTES * layout.header_len].view(torch.int64).tolist()
    kind, step, lengths = header[0], header[1], header[2:]
    if len(lengths) != len(layout.ids) + len(layout.values) or any(
            not 0 <= n <= cap for n, cap in zip(lengths, layout.ids + layout.values)):
        raise ValueError(f"a message header's piece lengths {lengths[:8]} do not fit its layout "
                         f"{layout.ids + layout.values}")
    offset = ID_BYTES * layout.header_len
    ids, values = [], []
    for cap, n in zip(layout.ids, lengths[:len(layout.ids)]):
        ids.append(buf[offset:offset + ID_BYTES * n].view(torch.int64))
        offset += ID_BYTES * cap
    for cap, n in zip(layout.values, lengths[len(layout.ids):]):
        values.append(buf[offset:offset + VALUE_BYTES * n].view(torch.float32))
        offset += VALUE_BYTES * cap
    return Message(kind, step, ids, values)


def send(pg, dst: int, msg: Message, layout: Layout, tag: int = TAG) -> list:
    """Start sending; returns (work, buffer) pairs to wait on (the buffer must stay alive until then)."""
    buf = pack(msg, layout)
    return [(pg.send([buf], dst, tag), buf)]


class PairGroups:
    """The send and recv of a process group over global ranks, each pair of ranks that talk (``peers``: the ranks
    this one talks to) on a two-rank gloo group of its own (module docstring). Built in one order of pairs on every
    rank (gloo's constructor waits for its peer), so that no two ranks wait for each other's later pair."""

    def __init__(self, store, rank: int, peers: list[int], timeout, prefix: str = "ps/pair/"):
        self.rank = rank
        self.groups = {}
        for peer in sorted(peers):      # ascending: every rank meets its pairs in one global order
            if peer != rank:
                low, high = min(rank, peer), max(rank, peer)
                self.groups[peer] = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}{low}-{high}/", store),
                                                          0 if rank == low else 1, 2, timeout)

    def _local(self, peer: int) -> int:
        """The peer's rank in the pair's group: the lower global rank is 0."""
        return 0 if peer < self.rank else 1

    def send(self, tensors: list, dst: int, tag: int):
        return self.groups[dst].send(tensors, self._local(dst), tag)

    def recv(self, tensors: list, src: int, tag: int):
        return self.groups[src].recv(tensors, self._local(src), tag)


def wait_all(works: list) -> None:
    for work, _ in works:
        work.wait()


def sent_unless(works: list, gone: Callable[[], bool], poll_s: float) -> bool:
    """Wait for sends (True when every one ended; a failed one raises its error) unless ``gone()``, read every
    ``poll_s``, says first that their peer is gone (False). A send to a peer that never posts its receive (it
    was killed) ends only at gloo's process-group timeout, and it cannot be polled: gloo's wait with a timeout
    on a point-to-point operation, once it expires, closes every pair of the process group ("Application
    timeout caused pair closure", gloo/transport/tcp/unbound_buffer.cc), and is_completed stays False until a
    wait. So the sends are waited for on a thread of their own; one given up on is left to end there, closing
    only its pair's group (PairGroups)."""
    done, failure = threading.Event(), []

    def wait() -> None:
        try:
            wait_all(works)
        except BaseException as exc:        # handed to the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, daemon=True).start()
    while not done.wait(poll_s):
        if gone():
            return False
    if failure:
        raise failure[0]
    return True


def receive(pg, src: int, layout: Layout, tag: int = TAG) -> Message:
    """Block until the next message from ``src`` has arrived (gloo's process-group timeout bounds it)."""
    buf = torch.empty(layout.nbytes, dtype=torch.uint8)
    pg.recv([buf], src, tag).wait()
    return unpack(buf, layout)


class Inbox:
    """Messages from many peers, each received on its own thread (module doc). ``get`` returns
    (peer, Message) or (peer, the exception its receive ended with). ``layouts(peer, previous)``
    gives the layout of a peer's next message from its previous one (None before the first)."""

    def __init__(self, pg, peers: list[int], messages_each: int,
                 layouts: Callable[[int, Message | None], Layout]):
        self.queue: queue.Queue = queue.Queue()
        self.held: dict[int, list] = {p: [] for p in peers}
        for p in peers:
            threading.Thread(target=self._receive, args=(pg, p, messages_each, layouts), daemon=True).start()

    def _receive(self, pg, peer: int, count: int, layouts) -> None:
        previous = None
        try:
            for _ in range(count):
                previous = receive(pg, peer, layouts(peer, previous))
                self.queue.put((peer, previous))
        except Exception as exc:   # noqa: BLE001 - handed to the main thread, which decides
            self.queue.put((peer, exc))

    def next_from(self, peers: set[int], timeout_s: float):
        """The oldest held item of any of ``peers``, waiting at most ``timeout_s``; None if none."""
        for p in sorted(peers):
            if self.held[p]:
                return p, self.held[p].pop(0)
        try:
            peer, item = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        self.held[peer].append(item)
        return self.next_from(peers, 0.0) if peer in peers else None


class Mailbox:
    """Messages of several streams in one queue: each stream (a peer and a tag, under a key of the
    caller's) is received in order on a thread of its own; ``get`` returns (key, peer, Message or the
    exception its receive ended with) from whichever stream delivered first, or None after ``timeout_s``."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def listen(self, pg, peer: int, tag: int, count: int, layouts: Callable[[int, Message | None], Layout],
               key) -> None:
        threading.Thread(target=self._receive, args=(pg, peer, tag, count, layouts, key), daemon=True).start()

    def _receive(self, pg, peer: int, tag: int, count: int, layouts, key) -> None:
        previous = None
        try:
            for _ in range(count):
                previous = receive(pg, peer, layouts(peer, previous), tag)
                self.queue.put((key, peer, previous))
        except Exception as exc:   # noqa: BLE001 - handed to the main thread, which decides
            self.queue.put((key, peer, exc))

    def get(self, timeout_s: float):
        try:
            return self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
