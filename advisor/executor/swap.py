"""Activation swapping as a plan's ``swap_layers`` asks (vPipe: Zhao et al., TPDS 2022, sec. 4;
MindFormers' swap_config layer_swap): the first k blocks of each pipeline stage copy what they save
for backward to host memory during their forward, and the backward fetches it back.

Each swapped block's forward runs under its own ``torch.autograd.graph.saved_tensors_hooks`` (the
innermost hooks are the ones autograd calls, as in torch's ``save_on_cpu``): a saved tensor's whole
storage is copied to the host once per block forward (views of one storage share the copy, as they
share the device storage) and autograd keeps only the host copy, so the device storage is freed once
the block's forward no longer needs it; the unpack hook rebuilds the same view on the device from the
host copy. Parameters are not swapped (they stay on the device for the backward); they, and any
tensor subclass, go to the tracker's own hook as outside a swapped block. Tensor-parallel layers save
DTensors, so swapping with tp > 1 is refused up front (advisor.executor.config).

The copies are counted in the rank's ActivationTracker: their bytes go into the micro-batch's saved
bytes (the plan's per-micro-batch activations are the same whether a layer swaps or not), and into
the host's live and peak bytes instead of the device's.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from advisor.executor.measure import ActivationTracker, is_parameter, storage_key


class _OnHost:
    """What autograd keeps for one swapped tensor: the host copy of its storage and the view."""

    __slots__ = ("host", "dtype", "offset", "size", "stride", "device", "__weakref__")

    def __init__(self, host: torch.Tensor, t: torch.Tensor):
        self.host, self.dtype, self.device = host, t.dtype, t.device
        self.offset, self.size, self.stride = t.storage_offset(), tuple(t.shape), tuple(t.stride())


class LayerSwap:
    """Swaps the saved tensors of the blocks it is attached to (see the module doc)."""

    def __init__(self, tracker: ActivationTracker):
        self.tracker = tracker
        self._contexts: list = []
        # storage key -> (host copy, the device tensor): held only during one block's forward, so that no
        # storage address can be reused while it keys a copy
        self._copies: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.swapped_tensors = 0

    def attach(self, block: nn.Module) -> None:
        block.register_forward_pre_hook(self._enter)
        block.register_forward_hook(self._exit)

    def _enter(self, module, args) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        hooks.__enter__()
        self._contexts.append(hooks)

    def _exit(self, module, args, output) -> None:
        self._contexts.pop().__exit__(None, None, None)
        self._copies.clear()

    def pack(self, t: torch.Tensor):
        if is_parameter(t) or type(t) is not torch.Tensor:
            return self.tracker.pack(t)
        key = storage_key(t)
        held = self._copies.get(key)
        if held is None:
            whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
            host = torch.empty(whole.shape, dtype=torch.uint8, device="cpu",
                               pin_memory=t.device.type == "cuda")
            host.copy_(whole, non_blocking=t.device.type == "cuda")
            held = self._copies[key] = (host, t)
            self.tracker.swap_out(host)
        self.swapped_tensors += 1
        packed = _OnHost(held[0], t)
        self.tracker.hold_host(packed, held[0])
        return packed

    def unpack(self, obj):
        if not isinstance(obj, _OnHost):
            return self.tracker.unpack(obj)
        storage = obj.host.to(obj.device, non_blocking=True).untyped_storage()
        return torch.empty(0, dtype=obj.dtype, device=obj.device).set_(storage, obj.offset, obj.size, obj.stride)


def swapped_blocks(chunk: nn.Module, count: int) -> list[nn.Module]:
    """The first ``count`` transformer blocks of a model chunk (its layers in order)."""
    return list(chunk.layers.values())[:count]

