"""Point-to-point messages between a worker and a server over a gloo process group.

A message is a header (int64: kind, step, how many id and value pieces, each piece's length), then
the id pieces concatenated (int64) and the value pieces concatenated (float32), each on its own tag
and sent only when not empty. Between one pair of processes gloo delivers the messages of one tag
in order, so the receiver reads the header and then knows what follows.

Gloo's point-to-point receive cannot be polled or abandoned (a wait that times out closes the
pair), so a server receives from each worker on a thread of its own (``Inbox``) that blocks on
that worker only; the server's main thread reads the inbox and can thus stop waiting for a worker
the scheduler has declared gone. A receive from a process that died ends at once with gloo's
"Connection closed by peer" error: the inbox hands that error on.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

HEADER_LEN = 512
PULL, PUSH = 0, 1
TAG_HEADER, TAG_IDS, TAG_VALUES = 0, 1, 2


@dataclass
class Message:
    kind: int
    step: int
    ids: list[torch.Tensor]
    values: list[torch.Tensor]


def send(pg, dst: int, msg: Message) -> list:
    """Start sending; returns (work, tensor) pairs to wait on (the tensors must stay alive until then)."""
    lengths = [t.numel() for t in msg.ids] + [t.numel() for t in msg.values]
    if 4 + len(lengths) > HEADER_LEN:
        raise ValueError(f"a message of {len(lengths)} pieces does not fit the {HEADER_LEN}-long header")
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[:4] = torch.tensor([msg.kind, msg.step, len(msg.ids), len(msg.values)])
    header[4:4 + len(lengths)] = torch.tensor(lengths, dtype=torch.int64)
    out = [(pg.send([header], dst, TAG_HEADER), header)]
    if sum(t.numel() for t in msg.ids):
        ids = torch.cat([t.reshape(-1).to(torch.int64) for t in msg.ids])
        out.append((pg.send([ids], dst, TAG_IDS), ids))
    if sum(t.numel() for t in msg.values):
        values = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in msg.values])
        out.append((pg.send([values], dst, TAG_VALUES), values))
    return out


def wait_all(works: list) -> None:
    for work, _ in works:
        work.wait()


def receive(pg, src: int) -> Message:
    """Block until the next message from ``src`` has arrived (gloo's process-group timeout bounds it)."""
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    pg.recv([header], src, TAG_HEADER).wait()
    kind, step, n_ids, n_values = header[:4].tolist()
    lengths = header[4:4 + n_ids + n_values].tolist()
    ids = _pieces(pg, src, TAG_IDS, torch.int64, lengths[:n_ids])
    values = _pieces(pg, src, TAG_VALUES, torch.float32, lengths[n_ids:])
    return Message(kind, step, ids, values)


def _pieces(pg, src: int, tag: int, dtype, lengths: list[int]) -> list[torch.Tensor]:
    flat = torch.empty(sum(lengths), dtype=dtype)
    if flat.numel():
        pg.recv([flat], src, tag).wait()
    return list(torch.split(flat, lengths)) if lengths else []


class Inbox:
    """Messages from many peers, each received on its own thread (module doc). ``get`` returns
    (peer, Message) or (peer, the exception its receive ended with)."""

    def __init__(self, pg, peers: list[int], messages_each: int):
        self.queue: queue.Queue = queue.Queue()
        self.held: dict[int, list] = {p: [] for p in peers}
        for p in peers:
            threading.Thread(target=self._receive, args=(pg, p, messages_each), daemon=True).start()

    def _receive(self, pg, peer: int, count: int) -> None:
        try:
            for _ in range(count):
                self.queue.put((peer, receive(pg, peer)))
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
