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
from typing import Any

import numpy as np

from advisor.errors import AdvisorError
from advisor.specs.bundled import bundled_dir
from advisor.specs.calibration import check_calibration
from advisor.specs import _fields as f
from advisor.specs import limits as lim
from advisor.specs.architectures import ARCHITECTURES
from advisor.specs.curves import DTYPES, attention_curves, gemm_curves, reference_curve
from advisor.specs.frameworks import CPU_ADAMS
from advisor.specs.units import normalize_bandwidths

PROFILES_DIR = bundled_dir("hardware_profiles")


@dataclass(frozen=True)
class Link:
    """One link tier: per-device, per-direction bandwidth, startup latency, achievable fraction."""

    name: str
    bandwidth_gbps: float
    latency_us: float
    efficiency: float = 1.0  # fraction of bandwidth that collectives reach (NCCL/HCCL bus bandwidth over peak)
    # Measured per-operation (latency_us, bandwidth_gbps) pairs, ((op, latency, bandwidth), ...), that
    # replace the link's own for that operation (``advisor calibrate`` fits them: gloo's all-reduce,
    # reduce-scatter and send/recv differ by several times in start-up cost and achieved bandwidth).
    per_op: tuple[tuple[str, float, float], ...] = ()
    # Host time of one parameter-server message (request, answer or push) at its endpoint, when measured
    # (``advisor calibrate``: a worker-server round of the executor's own messages); else the latency.
    message_overhead_us: float | None = None

    @property
    def message_s(self) -> float:
        return (self.latency_us if self.message_overhead_us is None else self.message_overhead_us) * 1e-6

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    def for_op(self, op: str) -> "Link":
        """The link as one operation sees it (itself unless a per-operation fit was measured)."""
        for name, latency_us, bandwidth_gbps in self.per_op:
            if name == op:
                return Link(self.name, bandwidth_gbps, latency_us, self.efficiency)
        return self


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gib: float
    memory_bandwidth_gbps: float
    peak_tflops: dict[str, float]
    # Achievable fraction of peak by GEMM work per call: ((gflop, efficiency), ...) ascending,
    # interpolated linearly in log10(gflop) and clamped at the ends. A profile may give one curve
    # per dtype (``matmul_efficiency: {bf16: [...], fp8: [...]}``): FP8 GEMMs reach a different
    # fraction of their own peak; the first curve given stands for dtypes without their own.
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
    # Collectives run beside the compute (NCCL/HCCL kernels on their own streams), so gradient
    # reduction and FSDP gathers hide behind backward and forward. A CPU rank's one core runs its
    # collectives and its compute in turn: nothing hides (``advisor calibrate`` writes false for gloo).
    overlaps_communication: bool = True
    # Memory traffic of the optimizer step per parameter; None = a fused Adam's one pass
    # (advisor.cost.optimizer_step.ADAM_BYTES_PER_PARAM). PyTorch's multi-tensor AdamW on a CPU makes
    # several passes; ``advisor calibrate`` measures it.
    optimizer_bytes_per_param: float | None = None
    # Host time per pipeline-schedule action (one chunk's forward or backward of one micro-batch)
    # beyond its kernels and transfers, by schedule: the schedule's own bookkeeping and the posting
    # of its sends and receives. ((schedule, us), ...); measured by ``advisor calibrate`` for
    # torch.distributed.pipelining on CPU ranks, where it is paid in line; 0 when not given
    # (GPUs hide it behind device time).
    pipeline_action_overhead_us: tuple[tuple[str, float], ...] = ()
    # Per-dtype GEMM curves, ((dtype, curve), ...), from a mapping-valued matmul_efficiency.
    matmul_efficiency_by_dtype: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # Fused (flash) attention: achievable fraction of the BF16/FP16 peak by sequence length,
    # ((tokens, efficiency), ...) ascending, log-linear like the GEMM curve (advisor.cost.attention),
    # one curve per kernel: ((kernel, curve), ...) from ``attention_efficiency: {te: [...], ...}``.
    attention_efficiency: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    # The device generation (advisor.specs.architectures): which kernels and number formats it runs;
    # None: not said, not checked
    architecture: str | None = None

    def gemm_curve(self, dtype: str) -> tuple[tuple[float, float], ...]:
        """The GEMM efficiency curve for a dtype (the default curve when it has none of its own)."""
        return dict(self.matmul_efficiency_by_dtype).get(dtype, self.matmul_efficiency)

    def attention_curve(self, kernel: str) -> tuple[tuple[float, float], ...]:
        """The kernel's attention curve; the profile's first one when it has none for this kernel
        (flagged as extrapolated by advisor.cost.confidence); () without any."""
        curves = dict(self.attention_efficiency)
        return curves.get(kernel, self.attention_efficiency[0][1] if self.attention_efficiency else ())

    def action_overhead_us(self, schedule: str) -> float:
        return dict(self.pipeline_action_overhead_us).get(schedule, 0.0)

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
    power_watts: float | None = None     # the node's power beside its devices (CPUs, NICs, switches, fans), at load
    # parameters per second one optimizer step of each CPU Adam reaches with all the host's cores (advisor
    # calibrate measures torch's; another is written by hand with its source), keyed as the framework records'
    # cpu_adam; without the framework's, the offloaded step is priced at the host's memory bandwidth alone
    cpu_adam_params_per_s: tuple[tuple[str, float], ...] = ()

    def cpu_adam_rate(self, kind: str) -> float | None:
        return dict(self.cpu_adam_params_per_s).get(kind)


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
    # What the loader assumed for the user (a reference GEMM curve), for estimate/recommend to print
    notes: tuple[str, ...] = field(default=(), compare=False)

    def with_overrides(
        self,
        inter_node_gbps: float | None = None,
        intra_node_gbps: float | None = None,
        memory_gib: float | None = None,
    ) -> "HardwareProfile":
        """A what-if variant; the raw mapping is updated too so plans record what was assumed."""
        for flag, value in (("--inter-node-gbps", inter_node_gbps), ("--intra-node-gbps", intra_node_gbps),
                            ("--memory-gib", memory_gib)):
            if value is not None:
                f.positive_float({flag: value}, flag, f"what-if of {self.name}")
        raw = _deep_copy(self.raw) if self.raw is not None else None
        prof = self
        if inter_node_gbps is not None:
            prof = replace(prof, inter=replace(prof.inter, bandwidth_gbps=inter_node_gbps / prof.oversubscription, per_op=()))
            if raw is not None:
                raw["inter_node"]["bandwidth_gbps"] = inter_node_gbps
                raw["inter_node"].pop("collectives", None)   # measured for the old link
        if intra_node_gbps is not None:
            prof = replace(prof, node=replace(prof.node, intra=replace(prof.node.intra, bandwidth_gbps=intra_node_gbps, per_op=())))
            if raw is not None:
                raw["node"]["intra_node"]["bandwidth_gbps"] = intra_node_gbps
                raw["node"]["intra_node"].pop("collectives", None)
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


COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


def _link(data: dict[str, Any], origin: str, name: str, bw_key: str = "bandwidth_gbps", lat_key: str = "latency_us") -> Link:
    return Link(
        name=name,
        bandwidth_gbps=f.positive_float(data, bw_key, origin),
        latency_us=f.positive_float(data, lat_key, origin),
        efficiency=f.fraction(data, "efficiency", origin, default=1.0),
        per_op=_per_op(data.get("collectives"), f"{origin}: collectives"),
    )


def _per_op(value: Any, origin: str) -> tuple[tuple[str, float, float], ...]:
    """``collectives: {all_reduce: {latency_us: .., bandwidth_gbps: ..}, ...}`` (optional)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise AdvisorError(f"{origin}: expected a mapping of operation to {{latency_us, bandwidth_gbps}}, got {f.prefix(value)}")
    out = []
    for op, pair in value.items():
        if op not in COLLECTIVE_OPS:
            raise AdvisorError(f"{origin}: unknown operation '{op}' (known: {', '.join(COLLECTIVE_OPS)})")
        f.check_keys(pair, f"{origin}: {op}", ("latency_us", "bandwidth_gbps"))
        out.append((op, f.positive_float(pair, "latency_us", f"{origin}: {op}"),
                    f.positive_float(pair, "bandwidth_gbps", f"{origin}: {op}")))
    return tuple(out)


def _action_overheads(value: Any, origin: str) -> tuple[tuple[str, float], ...]:
    """``pipeline_action_overhead_us: {1f1b: .., gpipe: .., interleaved-1f1b: ..}`` (optional)."""
    from advisor.space.strategy import SCHEDULES

    if value is None:
        return ()
    if not isinstance(value, dict):
        raise AdvisorError(f"{origin}: expected a mapping of pipeline schedule to microseconds, got {f.prefix(value)}")
    for schedule in value:
        if schedule not in SCHEDULES:
            raise AdvisorError(f"{origin}: unknown pipeline schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    return tuple((k, f.non_negative_float(value, k, origin)) for k in value)


def hardware_from_dict(data: dict[str, Any], origin: str) -> HardwareProfile:
    """The profile of a mapping; bandwidths with units ("200Gb/s") become GB/s numbers in it and in raw."""
    f.check_keys(data, origin, ("name", "source", "device", "node", "inter_node", "host"),
                 ("price_per_device_hour_usd", "power_watts", "notes", "calibration"))
    data = normalize_bandwidths(data, origin)
    check_calibration(data.get("calibration"), origin)
    do = f"{origin}: device"
    dev = data["device"]
    f.check_keys(dev, do, ("name", "memory_gib", "memory_bandwidth_gbps", "peak_tflops"),
                 ("matmul_efficiency", "memory_efficiency", "launch_overhead_us", "asynchronous_launch",
                  "optimizer_overhead_us_per_tensor", "optimizer_bytes_per_param", "pipeline_action_overhead_us",
                  "overlaps_communication", "attention_efficiency", "architecture", "notes"))
    peaks = dev["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise AdvisorError(f"{do}: key 'peak_tflops' must map dtypes to TFLOP/s, got {f.prefix(peaks)}")
    for dtype in peaks:
        if dtype not in DTYPES:
            raise AdvisorError(f"{do}: peak_tflops has unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
        f.positive_float(peaks, dtype, f"{do}: peak_tflops")
    notes, curve = (), dev.get("matmul_efficiency")
    if curve is None:
        curve, note = reference_curve(f.name(dev, "name", do), PROFILES_DIR, origin)
        notes = (note,)
    gemm_default, gemm_by_dtype = gemm_curves(curve, do)
    device = DeviceSpec(
        name=f.name(dev, "name", do),
        memory_gib=f.positive_float(dev, "memory_gib", do),
        memory_bandwidth_gbps=f.positive_float(dev, "memory_bandwidth_gbps", do),
        peak_tflops={k: float(v) for k, v in peaks.items()},
        matmul_efficiency=gemm_default,
        matmul_efficiency_by_dtype=gemm_by_dtype,
        attention_efficiency=attention_curves(dev.get("attention_efficiency"), do),
        memory_efficiency=f.fraction(dev, "memory_efficiency", do, default=0.8),
        launch_overhead_us=f.non_negative_float(dev, "launch_overhead_us", do, default=0.0),
        asynchronous_launch=f.boolean(dev, "asynchronous_launch", do, default=True),
        optimizer_overhead_us_per_tensor=f.non_negative_float(dev, "optimizer_overhead_us_per_tensor", do, default=0.0),
        overlaps_communication=f.boolean(dev, "overlaps_communication", do, default=True),
        optimizer_bytes_per_param=(None if dev.get("optimizer_bytes_per_param") is None
                                   else f.positive_float(dev, "optimizer_bytes_per_param", do)),
        pipeline_action_overhead_us=_action_overheads(dev.get("pipeline_action_overhead_us"),
                                                      f"{do}: pipeline_action_overhead_us"),
        architecture=(None if dev.get("architecture") is None
                      else f.choice(dev, "architecture", do, tuple(ARCHITECTURES))),
    )

    no = f"{origin}: node"
    nd = data["node"]
    f.check_keys(nd, no, ("devices_per_node", "intra_node"), ("notes",))
    per_node = f.positive_int(nd, "devices_per_node", no, maximum=lim.MAX_DEVICES_PER_NODE)
    io = f"{no}: intra_node"
    intra = nd["intra_node"]
    f.check_keys(intra, io, ("bandwidth_gbps", "latency_us", "topology"),
                 ("efficiency", "group_size", "cross_group_bandwidth_gbps", "cross_group_latency_us",
                  "cross_group_efficiency", "collectives", "notes"))
    topology = f.choice(intra, "topology", io, ("switch", "mesh-groups"))
    cross = None
    group_size = per_node
    if topology == "mesh-groups":
        group_size = f.positive_int(intra, "group_size", io, maximum=lim.MAX_DEVICES_PER_NODE)
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
    f.check_keys(inter, ino, ("bandwidth_gbps", "latency_us"),
                 ("topology", "oversubscription", "efficiency", "collectives", "message_overhead_us", "notes"))
    over = f.positive_float(inter, "oversubscription", ino, default=1.0)
    if over < 1.0:
        raise AdvisorError(f"{ino}: key 'oversubscription' must be >= 1, got {over}")
    link = _link(inter, ino, "inter")
    link = replace(link, bandwidth_gbps=link.bandwidth_gbps / over,
                   message_overhead_us=(f.positive_float(inter, "message_overhead_us", ino)
                                        if "message_overhead_us" in inter else None))

    ho = f"{origin}: host"
    host = data["host"]
    f.check_keys(host, ho, ("memory_gib", "pcie_bandwidth_gbps"),
                 ("memory_bandwidth_gbps", "power_watts", "cpu_adam_params_per_s", "notes"))
    host_bw = host.get("memory_bandwidth_gbps")
    adam = host.get("cpu_adam_params_per_s", {})
    if not isinstance(adam, dict):
        raise AdvisorError(f"{ho}: key 'cpu_adam_params_per_s' must map a CPU Adam (torch, deepspeed, mindspore) to "
                           f"parameters per second, got {f.prefix(adam)}")
    unknown = [k for k in adam if k not in CPU_ADAMS]
    if unknown:
        raise AdvisorError(f"{ho}: cpu_adam_params_per_s: unknown CPU Adam {f.prefix(unknown[0])} (known: "
                           f"{', '.join(CPU_ADAMS)})")
    price = data.get("price_per_device_hour_usd")
    power = data.get("power_watts")
    return HardwareProfile(
        name=f.name(data, "name", origin),
        source=f.text(data, "source", origin),
        device=device,
        node=node,
        inter=link,
        inter_topology=str(inter.get("topology", "fat-tree")),
        oversubscription=over,
        host=HostSpec(memory_gib=f.positive_float(host, "memory_gib", ho),
                      pcie_bandwidth_gbps=f.positive_float(host, "pcie_bandwidth_gbps", ho),
                      memory_bandwidth_gbps=None if host_bw is None else f.positive_float(host, "memory_bandwidth_gbps", ho),
                      power_watts=f.positive_float(host, "power_watts", ho) if "power_watts" in host else None,
                      cpu_adam_params_per_s=tuple((k, f.positive_float(adam, k, f"{ho}: cpu_adam_params_per_s"))
                                                  for k in sorted(adam))),
        price_per_device_hour_usd=None if price is None else f.positive_float(data, "price_per_device_hour_usd", origin),
        power_watts=None if power is None else f.positive_float(data, "power_watts", origin),
        raw=_deep_copy(data),
        notes=notes,
    )


def load_hardware(name_or_path: str) -> HardwareProfile:
    path = f.resolve_bundled(name_or_path, PROFILES_DIR, "hardware profile")
    return hardware_from_dict(f.read_mapping(path, "hardware profile"), str(path))


def bundled_hardware() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def interpolate_efficiency(curve: tuple[tuple[float, float], ...], gflop):
    """Efficiency at the given GEMM sizes (numpy-friendly): log-linear interpolation, clamped."""
    xs = np.log10([p[0] for p in curve])
    ys = np.array([p[1] for p in curve])
    x = np.log10(np.maximum(np.asarray(gflop, dtype=float), 1e-12))
    return np.interp(x, xs, ys)


