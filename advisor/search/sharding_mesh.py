"""The device mesh of operator-level sharding (advisor.search.sharding explains the model).

DeviceMesh: axes of devices, outermost first, laid over the hardware tiers (for_devices), and the
evenly strided group equivalent to any set of its axes (what a collective over those axes spans).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs.hardware import HardwareProfile


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


@dataclass(frozen=True)
class DeviceMesh:
    shape: tuple[int, ...]          # axis sizes, outermost first
    devices_per_node: int
    group_size: int                 # devices joined by the fastest links (= devices_per_node on switches)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        out, inner = [], 1
        for size in reversed(self.shape):
            out.append(inner)
            inner *= size
        return tuple(reversed(out))

    @staticmethod
    def for_devices(hw: HardwareProfile, devices: int, shape: tuple[int, ...] | None = None,
                    fine: bool = False) -> "DeviceMesh":
        per_node, group = hw.node.devices_per_node, hw.node.group_size
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise AdvisorError(f"device count must be a positive integer, got {devices!r}")
        if shape is None:
            shape = tuple(_default_shape(devices, per_node, group, fine))
        shape = tuple(int(x) for x in shape)
        if any(x < 2 for x in shape) or math.prod(shape) != devices:
            raise AdvisorError(f"mesh shape {list(shape)} must be axes of size >= 2 whose product is {devices} devices")
        return DeviceMesh(shape, per_node, group)

    @cached_property
    def _groups(self) -> dict[int, tuple[int, int]]:
        return {}

    def group(self, mask: int) -> tuple[int, int]:
        """(members, stride) of the evenly strided group that spans the same tiers as the axes in mask."""
        hit = self._groups.get(mask)
        if hit is None:
            hit = self._groups[mask] = self._equivalent_group(mask)
        return hit

    def _equivalent_group(self, mask: int) -> tuple[int, int]:
        axes = [k for k in range(len(self.shape)) if mask >> k & 1]
        n = math.prod(self.shape[k] for k in axes)
        if n <= 1:
            return 1, 1
        ranks = np.zeros(1, dtype=np.int64)
        for k in axes:
            ranks = (ranks[:, None] + np.arange(self.shape[k])[None, :] * self.strides[k]).ravel()
        in_group = int(np.sum(ranks < self.group_size))
        in_node = int(np.sum(ranks < self.devices_per_node))
        if in_group > 1:
            return n, max(self.group_size // in_group, 1)
        if in_node > 1:
            return n, max(self.devices_per_node // in_node, self.group_size)
        return n, self.devices_per_node

    def describe(self) -> str:
        return " x ".join(str(s) for s in self.shape)


def tensor_parallel_shapes(hw: HardwareProfile, devices: int) -> list[tuple[int, ...]]:
    """The meshes a tensor-parallel group of ``devices`` is searched on: the default one and, when
    that is a single axis, every split of it into two axes (a x devices / a, both orders), on which
    an operator can cut two of its dimensions at once: 2-D tensor parallelism (activations and
    weights both cut, as MindSpore's high-dimension tensor parallelism and Optimus do). Laid over
    the same devices and links, Megatron's layout (one label on every axis) costs the same on all."""
    default = tuple(_default_shape(devices, hw.node.devices_per_node, hw.node.group_size, fine=False))
    if len(default) != 1:
        return [default]
    return [default] + [(a, devices // a) for a in range(2, devices // 2 + 1) if devices % a == 0]


def _default_shape(devices: int, per_node: int, group: int, fine: bool) -> list[int]:
    intra = math.gcd(devices, per_node)
    inter = devices // intra
    fast = math.gcd(intra, group)
    tiers = [inter, intra // fast, fast]          # outermost first
    if fine:
        return [p for t in tiers for p in sorted(prime_factors(t), reverse=True)]
    out = []
    if inter > 1:
        primes = prime_factors(inter)
        out += [inter // primes[0], primes[0]] if len(primes) > 1 else [inter]
    return out + [t for t in tiers[1:] if t > 1]
