"""Per-rank memory measurements: exact byte counts of what the run keeps, by part.

* parameters: the parameter storage the forward and backward compute with, read right after a
  micro-batch's forward (ZeRO-3: the local shards, every FSDP group being resharded; ZeRO <= 2: the
  gathered, TP-local tensors). FSDP2's ZeRO-2 mode also keeps the sharded copy between steps: that
  is reported apart as ``fsdp_sharded_copy``.
* gradients: local gradient bytes after the step's backward (FSDP: the local shards).
* optimizer: local optimizer state (ZeRO-1: this rank's slice).
* activations per micro-batch: bytes saved for backward during one micro-batch's forward, seen by
  ``torch.autograd.graph.saved_tensors_hooks``, deduplicated by storage, excluding parameters and
  views of them, plus the inputs of checkpointed modules (hooks cannot see inside a checkpoint).
  With several chunks per rank (interleaved), one micro-batch's bytes of every chunk are summed.
* activations in flight: the peak, over the step, of the saved bytes still held (every micro-batch
  whose backward has not run yet), tracked by reference counts on the saved storages.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import torch
import torch.nn as nn


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """Plain tensors behind a wrapper subclass (DTensor, AsyncCollectiveTensor)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return _inner_tensors(t._local_tensor)
    if type(t) is not torch.Tensor and not isinstance(t, nn.Parameter) and hasattr(t, "elem"):
        return _inner_tensors(t.elem)
    return [t]


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors' data (numel x element size), deduplicated by address."""
    seen, total = set(), 0
    for t in tensors:
        for inner in _inner_tensors(t):
            key = (inner.data_ptr(), inner.numel())
            if key not in seen and inner.numel():
                seen.add(key)
                total += inner.numel() * inner.element_size()
    return total


def is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter)


class _Saved:
    """What the pack hook hands autograd: the tensor plus a reference on its storages."""

    __slots__ = ("tensor", "keys", "tracker", "__weakref__")

    def __init__(self, tensor, keys, tracker):
        self.tensor, self.keys, self.tracker = tensor, keys, tracker
        weakref.finalize(self, tracker._release, keys)


class ActivationTracker:
    """Saved-for-backward bytes per micro-batch forward (per module chunk) and their peak in flight."""

    def __init__(self):
        self.bucket: dict | None = None          # storage key -> bytes, the current forward
        self.per_forward: dict[str, list[int]] = defaultdict(list)
        self._current: str | None = None
        self.refs: dict[tuple[int, int], int] = defaultdict(int)
        self.sizes: dict[tuple[int, int], int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.enabled = False
        # activations swapped to the host (advisor.executor.swap): their live bytes and peak over the step
        self.host_refs: dict[tuple[int, int], int] = defaultdict(int)
        self.host_live_bytes = 0
        self.host_peak_bytes = 0

    # -- forward boundaries
    def begin(self, label: str) -> None:
        self.close()
        self.bucket, self._current = {}, label

    def close(self) -> None:
        if self.bucket is not None and self._current is not None:
            self.per_forward[self._current].append(sum(self.bucket.values()))
        self.bucket, self._current = None, None

    # -- saved tensors
    def _acquire(self, keys) -> None:
        for key, nbytes in keys:
            if self.refs[key] == 0:
                self.sizes[key] = nbytes
                self.live_bytes += nbytes
            self.refs[key] += 1
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _release(self, keys) -> None:
        for key, _ in keys:
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.live_bytes -= self.sizes.pop(key)
                del self.refs[key]

    def _keys(self, t: torch.Tensor) -> list[tuple[tuple[int, int], int]]:
        out = []
        for inner in _inner_tensors(t):
            if is_parameter(inner):
                continue
            key = storage_key(inner)
            out.append((key, key[1]))
        return out

    def pack(self, t: torch.Tensor):
        if not self.enabled or is_parameter(t):
            return t
        keys = self._keys(t)
        if self.bucket is not None:
            for key, nbytes in keys:
                self.bucket[key] = nbytes
        self._acquire(keys)
        return _Saved(t, keys, self)

    # -- swapped to the host (advisor.executor.swap): counted in the micro-batch's bytes, live on the host
    def swap_out(self, host: torch.Tensor) -> None:
        """A storage copied to the host for one block's saved tensors."""
        if self.enabled and self.bucket is not None:
            self.bucket[storage_key(host)] = host.untyped_storage().nbytes()

    def hold_host(self, packed, host: torch.Tensor) -> None:
        """``packed`` (what autograd keeps) refers to ``host`` until it is collected."""
        if not self.enabled:
            return
        key = storage_key(host)
        if self.host_refs[key] == 0:
            self.host_live_bytes += key[1]
        self.host_refs[key] += 1
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_live_bytes)
        weakref.finalize(packed, self._release_host, key)

    def _release_host(self, key) -> None:
        self.host_refs[key] -= 1
        if self.host_refs[key] == 0:
            self.host_live_bytes -= key[1]
            del self.host_refs[key]

    @staticmethod
    def unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # -- checkpointed modules keep their inputs instead
    def watch_checkpoint(self, wrapper: nn.Module) -> None:
        def pre_hook(module, args):
            if not self.enabled or torch._C._current_graph_task_id() != -1:
                return   # the recomputation inside backward
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            keys = [k for t in tensors for k in self._keys(t)]
            if self.bucket is not None:
                for key, nbytes in keys:
                    self.bucket[key] = nbytes
            self._acquire(keys)
            for t in tensors:
                weakref.finalize(t, self._release, [k for k in self._keys(t)])
        wrapper.register_forward_pre_hook(pre_hook)

    def watch_chunk(self, label: str, chunk: nn.Module) -> None:
        def pre_hook(module, args):
            if self.enabled and torch._C._current_graph_task_id() == -1:
                self.begin(label)
        chunk.register_forward_pre_hook(pre_hook, prepend=True)

    def first_microbatch_bytes(self) -> int:
        """One micro-batch's saved bytes on this rank (all chunks), from the first forwards."""
        return sum(values[0] for values in self.per_forward.values() if values)


class ParameterProbe:
    """Parameter bytes in use right after a micro-batch forward (see module doc)."""

    def __init__(self):
        self.compute_bytes: int | None = None

    def watch(self, chunks: list[nn.Module]) -> None:
        remaining = {id(c) for c in chunks}
        seen: dict[int, int] = {}

        def post_hook(module, args, output):
            if id(module) in remaining and torch._C._current_graph_task_id() == -1:
                remaining.discard(id(module))
                seen[id(module)] = tensor_bytes(module.parameters())
                if not remaining:
                    self.compute_bytes = sum(seen.values())
        for c in chunks:
            c.register_forward_hook(post_hook)


def parameter_bytes(chunks: list[nn.Module]) -> int:
    return tensor_bytes(p for c in chunks for p in c.parameters())


def gradient_bytes(chunks: list[nn.Module]) -> int:
    return tensor_bytes(p.grad for c in chunks for p in c.parameters() if p.grad is not None)
