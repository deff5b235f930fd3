"""Which parts of an estimate lie outside the region its profile was calibrated on.

A fitted profile carries a ``calibration:`` mapping (written by benchmarks/fit_profiles.py --write):
how many measured runs it was fitted on and what they covered: dtypes (FP8 with its recipe),
frameworks, attention kernels, sequence lengths, cluster sizes, parallelisms and knobs (tp, pp, cp,
ep, ZeRO-3, offload, a host embedding, CUDA graphs, MoE token dropping) and model kinds (dense,
MoE). An estimate is "calibrated" when its profile has such a mapping and every one of its choices
falls inside it; otherwise ``extrapolated`` names each part that does not
(e.g. "fp8 (mxfp8) on dgx-h100", "sequence 131072 beyond the calibrated 512-65536").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.cost.attention import HEAD_WIDTH_EFFICIENCY, head_width
from advisor.space.strategy import Strategy
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster, TrainingJob
from advisor.specs.model import ModelSpec



@dataclass(frozen=True)
class Confidence:
    calibrated: bool
    extrapolated: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"calibrated": self.calibrated, "extrapolated": list(self.extrapolated)}


def dtype_label(job: TrainingJob) -> str:
    return f"fp8:{job.recipe}" if job.recipe else job.dtype


def features(strategy: Strategy, job: TrainingJob | None = None, moe: bool = False) -> set[str]:
    """The parallelisms and knobs of a plan that calibration runs can cover (with the job: its CUDA
    graphs and, for MoE models, token dropping)."""
    out = {name for name in ("tp", "pp", "cp", "ep") if strategy.degree(name) > 1}
    if strategy.zero_stage == 3:
        out.add("zero3")
    if strategy.cp > 1 and strategy.cp_comm == "a2a":
        out.add("cp-a2a")
    if strategy.offload_optimizer:
        out.add("offload")
    if strategy.offload_params:
        out.add("offload-params")
    if strategy.host_embedding:
        out.add("host-embedding")
    if job is not None and job.cuda_graphs:
        out.add("cuda-graphs")
    if job is not None and moe and not job.moe_dropless:
        out.add("token-drop")
    return out


def _attention_kernel_notes(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, strategy: Strategy) -> list[str]:
    """Where the fused attention's pricing holds a measured value beyond its range: a head width
    outside the kernel's measured widths (advisor.cost.attention.HEAD_WIDTH_EFFICIENCY), ring steps
    shorter than the attention curve's first point."""
    out = []
    table = HEAD_WIDTH_EFFICIENCY.get(job.kernel)
    width = head_width(model)
    if table is not None and not table[0][0] <= width <= table[-1][0]:
        out.append(f"head width {width:g} outside the {table[0][0]}-{table[-1][0]} measured for {job.kernel}")
    curve = hw.device.attention_curve(job.kernel)
    step = job.seq_length / strategy.cp
    if curve and strategy.cp > 1 and strategy.cp_comm != "a2a" and step < curve[0][0]:
        out.append(f"ring attention steps of {step:g} tokens, shorter than the attention curve's first "
                   f"point ({curve[0][0]:g})")
    return out


def confidence(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, strategy: Strategy) -> Confidence:
    cal = (hw.raw or {}).get("calibration")      # validated at load (advisor.specs.calibration)
    if cal is None:
        return Confidence(False, (f"{hw.name}: no measured runs behind this profile's constants",))
    out = []
    label = dtype_label(job)
    if label not in cal.get("dtypes", ()):
        out.append(f"{label} on {hw.name} (calibrated: {', '.join(cal.get('dtypes', ())) or 'none'})")
    if job.framework not in cal.get("frameworks", ()):
        out.append(f"framework {job.framework} on {hw.name} (calibrated: {', '.join(cal.get('frameworks', ()))})")
    if job.attention == "flash" and job.kernel not in cal.get("attention_kernels", ()):
        curves = dict(hw.device.attention_efficiency)
        note = "" if job.kernel in curves else ", priced with another kernel's curve"
        out.append(f"attention kernel {job.kernel} on {hw.name}{note}")
    if job.attention == "flash":
        out.extend(_attention_kernel_notes(model, hw, job, strategy))
    low, high = cal.get("seq_length", (0, 0))
    if not low <= job.seq_length <= high:
        out.append(f"sequence {job.seq_length} outside the calibrated {low}-{high}")
    low, high = cal.get("devices", (0, 0))
    if not low <= cluster.devices <= high:
        out.append(f"{cluster.devices} devices outside the calibrated {low}-{high}")
    missing = sorted(features(strategy, job, model.moe is not None) - set(cal.get("parallelism", ())))
    if missing:
        out.append(f"{', '.join(missing)} on {hw.name}: no calibration run uses it")
    kind = "moe" if model.moe is not None else "dense"
    if kind not in cal.get("models", ()):
        out.append(f"{kind} models on {hw.name}: no calibration run")
    return Confidence(not out, tuple(out))


def summarize(runs) -> dict[str, Any]:
    """A calibration mapping from the runs a profile was fitted on (CalibrationRun-like objects:
    model, job, strategy, devices, group)."""
    dtypes, frameworks, kernels, parallelism, models, sources = set(), set(), set(), set(), set(), set()
    seqs, devices = [], []
    for r in runs:
        dtypes.add(dtype_label(r.job))
        frameworks.add(r.job.framework)
        if r.job.attention == "flash":
            kernels.add(r.job.kernel)
        parallelism |= features(r.strategy, r.job, r.model.moe is not None)
        models.add("moe" if r.model.moe is not None else "dense")
        sources.add(r.group)
        seqs.append(r.job.seq_length)
        devices.append(r.devices)
    return {"runs": len(seqs), "sources": sorted(sources), "dtypes": sorted(dtypes), "frameworks": sorted(frameworks),
            "attention_kernels": sorted(kernels), "seq_length": [min(seqs), max(seqs)],
            "devices": [min(devices), max(devices)], "parallelism": sorted(parallelism), "models": sorted(models)}
