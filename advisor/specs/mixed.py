"""A heterogeneous cluster: one job on nodes of several hardware profiles.

``--hardware dgx-a100-80g:4,dgx-h100:4`` names each part's profile (a bundled name or a path) and its
node count; the plan's ``hardware`` is then a list of ``{"profile": {...}, "nodes": N}`` (DESIGN.md,
"Heterogeneous clusters"). Every part has whole nodes; the parts are joined by the network between
nodes, whose slowest NIC the cost model prices (advisor.cost.mixed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs.hardware import HardwareProfile, hardware_from_dict, load_hardware
from advisor.specs.job import Cluster
from advisor.specs.untrusted import prefix

# Four device types in one job is beyond any published heterogeneous run (Metis, USENIX ATC'24,
# evaluates three GPU types; HexiScale two to three); each type multiplies the layouts tried.
MAX_PARTS = 4


@dataclass(frozen=True)
class ClusterPart:
    profile: HardwareProfile
    nodes: int

    @property
    def devices(self) -> int:
        return self.nodes * self.profile.node.devices_per_node

    @property
    def cluster(self) -> Cluster:
        return Cluster(nodes=self.nodes, devices=self.devices)


@dataclass(frozen=True)
class MixedHardware:
    parts: tuple[ClusterPart, ...]

    @property
    def devices(self) -> int:
        return sum(p.devices for p in self.parts)

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.parts)

    @property
    def cluster(self) -> Cluster:
        return Cluster(nodes=self.nodes, devices=self.devices)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.profile.name for p in self.parts)

    @property
    def label(self) -> str:
        return ",".join(f"{p.profile.name}:{p.nodes}" for p in self.parts)

    def part(self, name: str) -> ClusterPart:
        return next(p for p in self.parts if p.profile.name == name)

    def to_list(self) -> list[dict[str, Any]]:
        """The plan's ``hardware``: each part's profile mapping, verbatim, with its node count."""
        return [{"profile": p.profile.raw, "nodes": p.nodes} for p in self.parts]


def is_mixed(spec: str) -> bool:
    """Whether a --hardware value names parts with node counts (PROFILE:NODES,...)."""
    return isinstance(spec, str) and ":" in spec


def _check(parts: list[ClusterPart], origin: str) -> MixedHardware:
    if not 2 <= len(parts) <= MAX_PARTS:
        raise AdvisorError(f"{origin}: a mixed cluster has 2 to {MAX_PARTS} parts of different profiles, got "
                           f"{len(parts)} (one profile: give --hardware NAME with --nodes)")
    names = [p.profile.name for p in parts]
    if len(set(names)) != len(names):
        raise AdvisorError(f"{origin}: profile {prefix(sorted(n for n in names if names.count(n) > 1)[0])} is "
                           "named twice; give each profile once with its total node count")
    mixed = MixedHardware(tuple(parts))
    if mixed.devices > limits.MAX_DEVICES:
        raise AdvisorError(f"{origin}: {mixed.devices:,} devices exceeds the bound of {limits.MAX_DEVICES:,} devices "
                           "advisor accepts (advisor/specs/limits.py)")
    return mixed


def _nodes(text: str, origin: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1 or len(text) > 9:
        raise AdvisorError(f"{origin}: the node count after ':' must be a positive integer, got {prefix(text)}")
    return int(text)


def parse_mixed(spec: str) -> MixedHardware:
    """``PROFILE:NODES,PROFILE:NODES`` -> MixedHardware (profiles loaded; errors name the part)."""
    parts = []
    for item in spec.split(","):
        name, sep, count = item.strip().rpartition(":")
        if not sep or not name:
            raise AdvisorError(f"--hardware {prefix(spec)}: each part of a mixed cluster is PROFILE:NODES, "
                               f"got {prefix(item)}")
        parts.append(ClusterPart(load_hardware(name), _nodes(count, f"--hardware part {prefix(item)}")))
    return _check(parts, f"--hardware {prefix(spec)}")


def mixed_from_list(data: Any, origin: str) -> MixedHardware:
    """A plan's ``hardware`` list back into a MixedHardware."""
    if not isinstance(data, list):
        raise AdvisorError(f"{origin}: key 'hardware' must be a profile mapping or a list of "
                           "{'profile': ..., 'nodes': N}")
    parts = []
    for i, item in enumerate(data[:MAX_PARTS + 1]):
        where = f"{origin}: hardware[{i}]"
        if not isinstance(item, dict) or sorted(item) != ["nodes", "profile"] or not isinstance(item["profile"], dict):
            raise AdvisorError(f"{where} must be a mapping with keys 'profile' (a hardware profile) and 'nodes'")
        nodes = item["nodes"]
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= limits.MAX_DEVICES:
            raise AdvisorError(f"{where}: key 'nodes' must be a positive integer, got {prefix(nodes)}")
        parts.append(ClusterPart(hardware_from_dict(item["profile"], f"{where}.profile"), nodes))
    return _check(parts, origin)


@dataclass(frozen=True)
class MixedLayout:
    """Which device type runs what (advisor.cost.mixed): ``pipeline``: each stage's profile name
    (``parallel.stage_devices``); ``data``: each data-parallel replica's profile name and its
    micro-batches per step (``parallel.replica_devices``; its share of the global batch is
    ``parallel.dp_batch_split``)."""

    kind: str
    stage_devices: tuple[str, ...] = ()
    replica_devices: tuple[str, ...] = ()
    replica_micro_batches: tuple[int, ...] = ()

    def dp_batch_split(self) -> tuple[float, ...]:
        total = sum(self.replica_micro_batches)
        return tuple(m / total for m in self.replica_micro_batches)

    def part_micro_batches(self, mixed: MixedHardware) -> tuple[int, ...]:
        """The largest micro-batch count of any replica of each part (data layout)."""
        return tuple(max((m for d, m in zip(self.replica_devices, self.replica_micro_batches) if d == name), default=0)
                     for name in mixed.names)

    def to_parallel(self) -> dict[str, Any]:
        """The plan's ``parallel`` keys of this layout."""
        if self.kind == "pipeline":
            return {"stage_devices": list(self.stage_devices)}
        return {"replica_devices": list(self.replica_devices),
                "dp_batch_split": [round(s, 9) for s in self.dp_batch_split()]}
