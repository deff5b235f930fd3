"""One strategy's estimate with its reasons, memory and time by part, and training totals.

The vectorized pricing lives in advisor.cost.step (estimate_batch); this module turns one
candidate of a batch into an Estimate and scores single strategies (illegal ones and plans that do
not fit are results, with reasons, never exceptions).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.cost import carbon, dataset
from advisor.cost.band import Band, band
from advisor.cost.confidence import Confidence, confidence
from advisor.cost.memory import GIB
from advisor.cost.step import KERNELS_BACKWARD, KERNELS_FORWARD, TIME_PARTS, EstimateBatch, estimate_batch
from advisor.space.rules import violations
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec

__all__ = ["Estimate", "EstimateBatch", "MemoryBreakdown", "estimate", "estimate_batch", "from_batch",
           "KERNELS_FORWARD", "KERNELS_BACKWARD", "TIME_PARTS", "MEMORY_PARTS"]

MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers", "total")


# ---- one strategy ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryBreakdown:
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    total: float


@dataclass(frozen=True)
class Estimate:
    feasible: bool
    reasons: tuple[str, ...]
    memory_gib: MemoryBreakdown
    capacity_gib: float
    activation_gib_per_microbatch: float
    host_optimizer_gib: float
    time_s: dict[str, float]
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    tflops_per_device: float
    hfu_tflops_per_device: float
    mfu: float
    hfu: float
    worst_memory_stage: int
    slowest_stage: int
    bottleneck: str
    time_to_train_s: float | None = None
    cost_to_train_usd: float | None = None
    energy_to_train_kwh: float | None = None      # facility energy (advisor.cost.carbon)
    emissions_to_train_tco2e: float | None = None
    devices: int = 0
    confidence: Confidence | None = None     # parts outside the profile's calibrated region
    band: Band | None = None                 # the prediction's error band (advisor.cost.band), with its confidence
    dp_traffic_share: float | None = None    # all data-parallel traffic over the compute it overlaps (EstimateBatch)
    input_read_gb_per_step: float | None = None   # the cluster's reads of training samples (advisor.cost.dataset)
    host_params_gib: float = 0.0                  # offloaded weight and gradient shards per device (offload_params)
    host_embedding_gib: float = 0.0               # the word-embedding slice, its states and gradient (host_embedding)
    host_activations_gib: float = 0.0             # activations swapped to the host per device (swap_layers)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        out["reasons"] = list(self.reasons)
        out["band"] = None if self.band is None else self.band.to_dict(self.tokens_per_s, self.step_time_s,
                                                                         self.memory_gib.total)
        return out


def bottleneck_name(time_parts: dict[str, float], memory_fraction: float) -> str:
    """The largest time part; 'memory headroom' when the plan uses more than 95% of the device."""
    if memory_fraction > 0.95:
        return "memory headroom"
    return max(time_parts, key=lambda k: time_parts[k])


def estimate(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, strategy: Strategy) -> Estimate:
    """Score one strategy. Illegal strategies and plans that do not fit are results, with reasons. What the job's
    framework runs (advisor.space.rules.FRAMEWORK_RULES) is judged by the commands that launch or search, not here:
    a strategy is priced as the framework's kernels and defaults would run it."""
    reasons = violations(model, cluster, job, strategy, framework_rules=False)
    malformed = (strategy.stage_layers is not None and len(strategy.stage_layers) != strategy.pp) or (
        isinstance(strategy.recompute_layers, tuple) and len(strategy.recompute_layers) != strategy.pp) or min(
        strategy.dp, strategy.tp, strategy.pp, strategy.cp, strategy.ep, strategy.micro_batch_size,
        strategy.num_micro_batches, strategy.virtual_pipeline_stages) < 1
    if malformed:   # no shape to price: the reasons say why
        return _illegal(hw, cluster, reasons[0])
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    e = estimate_batch(model, hw, cluster, job, batch)
    return from_batch(e, 0, model, hw, cluster, job, extra_reasons=reasons, strategy=strategy)


def from_batch(e: EstimateBatch, i: int, model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob,
               extra_reasons: list[str] | tuple[str, ...] = (), strategy: Strategy | None = None) -> Estimate:
    """Candidate i of a batch estimate as an Estimate (with reasons and time to train; with its
    confidence when the strategy is given)."""
    mem = {k: float(getattr(e.memory, k)[i]) / GIB for k in MEMORY_PARTS}
    capacity = job.usable_memory_gib(hw.device.memory_gib)
    reasons = list(extra_reasons)
    if not bool(e.fits[i]):
        reasons.append(f"needs {mem['total']:.1f} GiB per device on pipeline stage {int(e.memory.worst_stage[i])}, "
                       f"the device has {capacity:g} GiB" + (f" to use (its {hw.device.memory_gib:g} GiB less the "
                                                            f"{job.memory_margin:.0%} margin)" if job.memory_margin else ""))
    if not bool(e.host_fits[i]):
        node = e.host_node_bytes if e.host_node_bytes is not None else e.memory.host_total * hw.node.devices_per_node
        need = float(node[i]) / GIB
        reasons.append(f"what lives in host memory (offloaded states, swapped activations, a host embedding) "
                       f"needs {need:.0f} GiB per "
                       f"node, the host has {hw.host.memory_gib:g} GiB")
    times = {k: float(v[i]) for k, v in e.time_s.items()}
    step = float(e.step_time_s[i])
    tps = float(e.tokens_per_s[i])
    train_s = cost = energy = emissions = None
    if job.train_tokens is not None:
        train_s = job.train_tokens / tps
        hours = train_s / 3600.0 * cluster.devices
        cost = hours * hw.price_per_device_hour_usd if hw.price_per_device_hour_usd else None
        power = carbon.cluster_power_w(hw, job.dtype, cluster.devices, float(e.hfu[i]))
        energy = None if power is None else float(carbon.energy_kwh(power, train_s, job.pue))
        if energy is not None and job.grid_gco2e_per_kwh is not None:
            emissions = float(carbon.emissions_tco2e(energy, job.grid_gco2e_per_kwh))
    share = None if e.dp_traffic_share is None else float(e.dp_traffic_share[i])
    conf = None if strategy is None else confidence(model, hw, cluster, job, strategy, dp_share=share)
    return Estimate(
        feasible=not reasons,
        reasons=tuple(reasons),
        memory_gib=MemoryBreakdown(**mem),
        capacity_gib=capacity,
        activation_gib_per_microbatch=float(e.memory.activation_per_microbatch[i]) / GIB,
        host_optimizer_gib=float(e.memory.host_optimizer[i]) / GIB,
        host_params_gib=float(e.memory.host_params[i]) / GIB if e.memory.host_params is not None else 0.0,
        host_embedding_gib=float(e.memory.host_embedding[i]) / GIB if e.memory.host_embedding is not None else 0.0,
        host_activations_gib=(float(e.memory.host_activations[i]) / GIB if e.memory.host_activations is not None
                              else 0.0),
        time_s=times,
        step_time_s=step,
        tokens_per_s=tps,
        tokens_per_s_per_device=tps / cluster.devices,
        tflops_per_device=float(e.tflops_per_device[i]),
        hfu_tflops_per_device=float(e.hfu_tflops_per_device[i]),
        mfu=float(e.mfu[i]),
        hfu=float(e.hfu[i]),
        worst_memory_stage=int(e.memory.worst_stage[i]),
        slowest_stage=int(e.slowest_stage[i]),
        bottleneck=bottleneck_name(times, mem["total"] / capacity),
        time_to_train_s=train_s,
        cost_to_train_usd=cost,
        energy_to_train_kwh=energy,
        emissions_to_train_tco2e=emissions,
        devices=cluster.devices,
        confidence=conf,
        band=None if conf is None else band(hw.name, len(conf.extrapolated)),
        dp_traffic_share=share,
        input_read_gb_per_step=None if strategy is None else dataset.cluster_read_gb(job, strategy, cluster.devices),
    )


def _illegal(hw: HardwareProfile, cluster: Cluster, reason: str) -> Estimate:
    zero = MemoryBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return Estimate(
        feasible=False, reasons=(reason,), memory_gib=zero, capacity_gib=hw.device.memory_gib,
        activation_gib_per_microbatch=0.0, host_optimizer_gib=0.0, time_s={k: 0.0 for k in TIME_PARTS},
        step_time_s=0.0, tokens_per_s=0.0, tokens_per_s_per_device=0.0, tflops_per_device=0.0,
        hfu_tflops_per_device=0.0, mfu=0.0, hfu=0.0, worst_memory_stage=0, slowest_stage=0,
        bottleneck="illegal", devices=cluster.devices,
    )
