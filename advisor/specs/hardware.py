"""Hardware profiles (hardware_profiles/NAME.yaml): one node type, its device and its links.

Units live in key names: *_gib (2**30 bytes), *_gbps (10**9 bytes per second, per device and per
direction), *_us (microseconds), peak_tflops (10**12 FLOP/s). The cluster size is not part of a
profile; it comes from the command line.

Link tiers, fastest first:
  * ``intra``: devices inside one node group (the whole node for a switch topology such as NVSwitch;
    one HCCS group of ``group_size`` devices for Ascend's ``mesh-groups`` topology);
  * ``cross``: between the groups of one node (``mesh-groups`` only; PCIe on the Atlas 800);
  * ``inter``: between nodes (per-device NIC bandwidth, divided by the oversubscription ratio).
"""

from __future__ import annotations


from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs import _fields as f

PROFILES_DIR = Path(__file__).resolve().parents[2] / "hardware_profiles"
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Link:
    """One link tier: per-device, per-direction bandwidth, startup latency, achievable fraction."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    efficiency: float = 1.0  # fraction of bandwidth that collectives reach (NCCL/HCCL bus bandwidth over peak)

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gib: float
    memory_bandwidth_gbps: float
    peak_tflops: dict[str, float]
    # Achievable fraction of peak by GEMM work per call: ((gflop, efficiency), ...) ascending,
    # interpolated linearly in log10(gflop) and clamped at the ends.
    matmul_efficiency: tuple[tuple[float, float], ...]
    memory_efficiency: float = 0.8  # achievable fraction of memory bandwidth for element-wise kernels
    # Host time to issue one kernel (framework dispatch + driver launch). Small layers finish on the
    # device faster than the host can issue their kernels; then the host sets the pace.
    launch_overhead_us: float = 0.0
    # GPUs/NPUs run kernels asynchronously, so host launch time hides behind device time; a CPU
    # executes each operator on the issuing thread, so its per-operator overhead adds to the compute.
    asynchronous_launch: bool = True
    # Host time per parameter tensor of an unfused optimizer step (PyTorch's per-tensor AdamW on a
    # CPU); fused/multi-tensor optimizers on accelerators (Megatron's FusedAdam) make it negligible.
    optimizer_overhead_us_per_tensor: float = 0.0

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise AdvisorError(f"device {self.name} has no peak_tflops for dtype '{dtype}' (has: {', '.join(self.peak_tflops)})")
        return self.peak_tflops[dtype] * 1e12


@dataclass(frozen=True)
class NodeSpec:
    devices_per_node: int
    topology: str                       # switch | mesh-groups
    intra: Link
    group_size: int                     # devices joined by the fast intra link (= devices_per_node for switch)
    cross: Link | None = None           # between groups of one node (mesh-groups)


@dataclass(frozen=True)
class HostSpec:
    memory_gib: float
    pcie_bandwidth_gbps: float           # per device, host <-> device
    memory_bandwidth_gbps: float | None = None  # whole host (all sockets), for CPU optimizer steps under offload


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    source: str
    device: DeviceSpec
    node: NodeSpec
    inter: Link                         # between nodes, per device (after oversubscription)
    inter_topology: str
    oversubscription: float
    host: HostSpec
    price_per_device_hour_usd: float | None = None
    power_watts: float | None = None
    raw: dict[str, Any] = field(default=None, compare=False, repr=False)  # the mapping it was loaded from

    def with_overrides(
        self,
        inter_node_gbps: float | None = None,
        intra_node_gbps: float | None = None,
        memory_gib: float | None = None,
    ) -> "HardwareProfile":
        """A what-if variant; the raw mapping is updated too so plans record what was assumed."""
        raw = _deep_copy(self.raw) if self.raw is not None else None
        prof = self
        if inter_node_gbps is not None:
            prof = replace(prof, inter=replace(prof.inter, bandwidth_gbps=inter_node_gbps / prof.oversubscription))
            if raw is not None:
                raw["inter_node"]["bandwidth_gbps"] = inter_node_gbps
        if intra_node_gbps is not None:
            prof = replace(prof, node=replace(prof.node, intra=replace(prof.node.intra, bandwidth_gbps=intra_node_gbps)))
            if raw is not None:
                raw["node"]["intra_node"]["bandwidth_gbps"] = intra_node_gbps
        if memory_gib is not None:
            prof = replace(prof, device=replace(prof.device, memory_gib=memory_gib))
            if raw is not None:
                raw["device"]["memory_gib"] = memory_gib
        suffix = "+".join(
            s for s in (
                f"inter{inter_node_gbps:g}" if inter_node_gbps is not None else "",
                f"intra{intra_node_gbps:g}" if intra_node_gbps is not None else "",
                f"mem{memory_gib:g}" if memory_gib is not None else "",
            ) if s
        )
        if suffix:
            prof = replace(prof, name=f"{self.name}[{suffix}]")
            if raw is not None:
                raw["name"] = prof.name
        return replace(prof, raw=raw)


def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_deep_copy(v) for v in obj]
    return obj


def _link(data: dict[str, Any], origin: str, name: str, bw_key: str = "bandwidth_gbps", lat_key: str = "latency_us") -> Link:
    return Link(
        name=name,
        bandwidth_gbps=f.positive_float(data, bw_key, origin),
        latency_us=f.positive_float(data, lat_key, origin),
        efficiency=f.fraction(data, "efficiency", origin, default=1.0),
    )


def _efficiency_curve(value: Any, origin: str) -> tuple[tuple[float, float], ...]:
    key = f"{origin}: key 'matmul_efficiency'"
    if not isinstance(value, list) or not value:
        raise AdvisorError(f"{key} must be a non-empty list of [gflop, efficiency] pairs, got {value!r}")
    points = []
    for item in value:
        ok = isinstance(item, (list, tuple)) and len(item) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in item
        )
        if not ok or item[0] <= 0 or not 0 < item[1] <= 1:
            raise AdvisorError(f"{key} has a bad point {item!r}: want [gflop > 0, 0 < efficiency <= 1]")
        points.append((float(item[0]), float(item[1])))
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise AdvisorError(f"{key} must list gflop in increasing order, got {value!r}")
    return tuple(points)


def hardware_from_dict(data: dict[str, Any], origin: str) -> HardwareProfile:
    f.check_keys(data, origin, ("name", "source", "device", "node", "inter_node", "host"),
                 ("price_per_device_hour_usd", "power_watts", "notes"))
    do = f"{origin}: device"
    dev = data["device"]
    f.check_keys(dev, do, ("name", "memory_gib", "memory_bandwidth_gbps", "peak_tflops", "matmul_efficiency"),
                 ("memory_efficiency", "launch_overhead_us", "asynchronous_launch",
                  "optimizer_overhead_us_per_tensor", "notes"))
    peaks = dev["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise AdvisorError(f"{do}: key 'peak_tflops' must map dtypes to TFLOP/s, got {peaks!r}")
    for dtype in peaks:
        if dtype not in DTYPES:
            raise AdvisorError(f"{do}: peak_tflops has unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
        f.positive_float(peaks, dtype, f"{do}: peak_tflops")
    device = DeviceSpec(
        name=f.text(dev, "name", do),
        memory_gib=f.positive_float(dev, "memory_gib", do),
        memory_bandwidth_gbps=f.positive_float(dev, "memory_bandwidth_gbps", do),
        peak_tflops={k: float(v) for k, v in peaks.items()},
        matmul_efficiency=_efficiency_curve(dev["matmul_efficiency"], do),
        memory_efficiency=f.fraction(dev, "memory_efficiency", do, default=0.8),
        launch_overhead_us=f.non_negative_float(dev, "launch_overhead_us", do, default=0.0),
        asynchronous_launch=f.boolean(dev, "asynchronous_launch", do, default=True),
        optimizer_overhead_us_per_tensor=f.non_negative_float(dev, "optimizer_overhead_us_per_tensor", do, default=0.0),
    )

    no = f"{origin}: node"
    nd = data["node"]
    f.check_keys(nd, no, ("devices_per_node", "intra_node"), ("notes",))
    per_node = f.positive_int(nd, "devices_per_node", no)
    io = f"{no}: intra_node"
    intra = nd["intra_node"]
    f.check_keys(intra, io, ("bandwidth_gbps", "latency_us", "topology"),
                 ("efficiency", "group_size", "cross_group_bandwidth_gbps", "cross_group_latency_us",
                  "cross_group_efficiency", "notes"))
    topology = f.choice(intra, "topology", io, ("switch", "mesh-groups"))
    cross = None
    group_size = per_node
    if topology == "mesh-groups":
        group_size = f.positive_int(intra, "group_size", io)
        if per_node % group_size:
            raise AdvisorError(f"{io}: key 'group_size' = {group_size} does not divide devices_per_node = {per_node}")
        cross = Link(
            name="cross",
            bandwidth_gbps=f.positive_float(intra, "cross_group_bandwidth_gbps", io),
            latency_us=f.positive_float(intra, "cross_group_latency_us", io),
            efficiency=f.fraction(intra, "cross_group_efficiency", io, default=1.0),
        )
    node = NodeSpec(devices_per_node=per_node, topology=topology, intra=_link(intra, io, "intra"),
                    group_size=group_size, cross=cross)

    ino = f"{origin}: inter_node"
    inter = data["inter_node"]
    f.check_keys(inter, ino, ("bandwidth_gbps", "latency_us"), ("topology", "oversubscription", "efficiency", "notes"))
    over = f.positive_float(inter, "oversubscription", ino, default=1.0)
    if over < 1.0:
        raise AdvisorError(f"{ino}: key 'oversubscription' must be >= 1, got {over}")
    link = _link(inter, ino, "inter")
    link = replace(link, bandwidth_gbps=link.bandwidth_gbps / over)

    ho = f"{origin}: host"
    host = data["host"]
    f.check_keys(host, ho, ("memory_gib", "pcie_bandwidth_gbps"), ("memory_bandwidth_gbps", "notes"))
    host_bw = host.get("memory_bandwidth_gbps")
    price = data.get("price_per_device_hour_usd")
    power = data.get("power_watts")
    return HardwareProfile(
        name=f.text(data, "name", origin),
        source=f.text(data, "source", origin),
        device=device,
        node=node,
        inter=link,
        inter_topology=str(inter.get("topology", "fat-tree")),
        oversubscription=over,
        host=HostSpec(memory_gib=f.positive_float(host, "memory_gib", ho),
                      pcie_bandwidth_gbps=f.positive_float(host, "pcie_bandwidth_gbps", ho),
                      memory_bandwidth_gbps=None if host_bw is None else f.positive_float(host, "memory_bandwidth_gbps", ho)),
        price_per_device_hour_usd=None if price is None else f.positive_float(data, "price_per_device_hour_usd", origin),
        power_watts=None if power is None else f.positive_float(data, "power_watts", origin),
        raw=_deep_copy(data),
    )


def load_hardware(name_or_path: str) -> HardwareProfile:
    path = f.resolve_bundled(name_or_path, PROFILES_DIR, "hardware profile")
    return hardware_from_dict(f.read_mapping(path), str(path))


def bundled_hardware() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def interpolate_efficiency(curve: tuple[tuple[float, float], ...], gflop):
    """Efficiency at the given GEMM sizes (numpy-friendly): log-linear interpolation, clamped."""
    xs = np.log10([p[0] for p in curve])
    ys = np.array([p[1] for p in curve])
    x = np.log10(np.maximum(np.asarray(gflop, dtype=float), 1e-12))
    return np.interp(x, xs, ys)


