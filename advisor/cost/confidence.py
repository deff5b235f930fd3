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

import numpy as np

from advisor.cost.attention import HEAD_WIDTH_EFFICIENCY, head_width
from advisor.cost.band import coverage_of, pessimistic_factor
from advisor.space.strategy import CP_COMM, Strategy, StrategyBatch
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


def feature_masks(b: StrategyBatch, job: TrainingJob | None = None, moe: bool = False) -> dict[str, np.ndarray]:
    """Per candidate, which of the parallelisms and knobs that calibration runs can cover it uses ((N,)
    boolean arrays; with the job: its CUDA graphs and, for MoE models, token dropping)."""
    n = len(b)
    out = {name: getattr(b, name) > 1 for name in ("tp", "pp", "cp", "ep")}
    out["zero3"] = b.zero_stage == 3
    out["cp-a2a"] = (b.cp > 1) & (b.cp_comm == CP_COMM.index("a2a"))
    out["offload"] = np.asarray(b.offload_optimizer, dtype=bool)
    out["offload-params"] = np.asarray(b.offload_params, dtype=bool)
    out["host-embedding"] = np.asarray(b.host_embedding, dtype=bool)
    if job is not None:
        out["cuda-graphs"] = np.full(n, bool(job.cuda_graphs))
        out["token-drop"] = np.full(n, bool(moe and not job.moe_dropless))
    return out


def features(strategy: Strategy, job: TrainingJob | None = None, moe: bool = False) -> set[str]:
    """The parallelisms and knobs of one plan that calibration runs can cover (feature_masks)."""
    masks = feature_masks(StrategyBatch.from_strategies([strategy], max(strategy.pp, 1)), job, moe)
    return {name for name, on in masks.items() if bool(on[0])}


def _coverage_masks(model: ModelSpec, job: TrainingJob, b: StrategyBatch, dp_share, cov: dict[str, Any]):
    """The plan-dependent ranges the measured runs span (the band table's coverage, advisor.cost.band): per
    check, (N,) mask of the candidates beyond it and a function naming candidate i's part."""
    out = []
    ranks = b.dp * b.cp
    zero3 = cov.get("zero3_ranks")
    if zero3 is not None:
        beyond = (b.zero_stage == 3) & (ranks > zero3[1])
        out.append((beyond, lambda i: f"ZeRO-3 sharded over {int(ranks[i])} ranks, beyond the calibrated "
                                      f"{zero3[0]}-{zero3[1]}"))
    share = cov.get("dp_traffic_share")
    if share is not None and dp_share is not None:
        beyond = np.asarray(dp_share) > share
        out.append((beyond, lambda i: f"data-parallel traffic {float(dp_share[i]):.2f} of the compute it overlaps, "
                                      f"beyond the calibrated {share:.2f}"))
    tokens = cov.get("moe_micro_batch_tokens")
    if model.moe is not None and tokens is not None:
        mb_tokens = b.micro_batch_size * job.seq_length
        beyond = (mb_tokens < tokens[0]) | (mb_tokens > tokens[1])
        out.append((beyond, lambda i: f"MoE micro-batches of {int(mb_tokens[i])} tokens outside the calibrated "
                                      f"{tokens[0]}-{tokens[1]}"))
    return out


def plan_parts(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, dp_share=None,
               cal: dict[str, Any] | None = None, cov: dict[str, Any] | None = None) -> np.ndarray:
    """(N,) count of each candidate's plan-dependent parts outside the calibrated region (its features no run
    uses, the coverage ranges it leaves): what widens its band (advisor.cost.band) beyond what every plan of the
    job shares."""
    cal = _calibration(hw) if cal is None else cal
    cov = coverage_of(hw.name) if cov is None else cov
    n = np.zeros(len(b), dtype=np.int64)
    if cal is None:
        return n
    calibrated = set(cal.get("parallelism", ()))
    with_framework = _framework_parallelism(cal, job)
    for name, on in feature_masks(b, job, model.moe is not None).items():
        if name in ("cuda-graphs", "token-drop"):
            continue
        if name not in calibrated or (with_framework is not None and name not in with_framework):
            n += on
    for beyond, _ in _coverage_masks(model, job, b, dp_share, cov):
        n += beyond
    return n


def pessimistic_tokens_per_s(model: ModelSpec, hw: HardwareProfile, job: TrainingJob, b: StrategyBatch, e) -> np.ndarray:
    """What recommend ranks by: each candidate's throughput at the pessimistic end of its band (advisor.cost.band),
    counting the parts outside the calibrated region that depend on the plan. ``e``: the candidates'
    EstimateBatch."""
    parts = plan_parts(model, hw, job, b, e.dp_traffic_share)
    return e.tokens_per_s * pessimistic_factor(hw.name, parts)


def _framework_parallelism(cal: dict[str, Any], job: TrainingJob) -> set[str] | None:
    """The parallelisms and knobs the profile's runs used under the job's framework, or None where that is not
    known (a mapping written before it was recorded) or the framework has no run on the profile (then the
    framework itself is the part outside, alike for every plan). A parallelism measured under one framework is
    not known under another: Megatron's tensor parallelism (fused kernels, its own overlap) says little of how
    PyTorch's DTensor runs it, so a plan using it there is priced outside the region."""
    pairs = cal.get("framework_parallelism")
    if pairs is None or job.framework not in cal.get("frameworks", ()):
        return None
    prefix = f"{job.framework}:"
    return {p[len(prefix):] for p in pairs if p.startswith(prefix)}


def _calibration(hw: HardwareProfile):
    return (hw.raw or {}).get("calibration")      # validated at load (advisor.specs.calibration)


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


def confidence(model: ModelSpec, hw: HardwareProfile, cluster: Cluster, job: TrainingJob, strategy: Strategy,
               dp_share: float | None = None, cal: dict[str, Any] | None = None,
               cov: dict[str, Any] | None = None) -> Confidence:
    """Which parts of one plan's estimate lie outside the region its profile was calibrated on (``cal``: the
    profile's calibration mapping, ``cov``: the band table's coverage; by default the bundled ones).
    ``dp_share``: the estimate's data-parallel traffic over compute (EstimateBatch.dp_traffic_share)."""
    cal = _calibration(hw) if cal is None else cal
    cov = coverage_of(hw.name) if cov is None else cov
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
    batch = StrategyBatch.from_strategies([strategy], model.num_layers)
    used = {name for name, on in feature_masks(batch, job, model.moe is not None).items() if bool(on[0])}
    measured = set(cal.get("parallelism", ()))
    missing = sorted(used - measured)
    if missing:
        out.append(f"{', '.join(missing)} on {hw.name}: no calibration run uses it")
    with_framework = _framework_parallelism(cal, job)
    unmeasured = sorted(used & measured - (with_framework if with_framework is not None else used))
    if unmeasured:
        out.append(f"{', '.join(unmeasured)} under {job.framework} on {hw.name}: calibration runs use it only "
                   f"under other frameworks")
    share = None if dp_share is None else np.array([dp_share])
    out.extend(part(0) for beyond, part in _coverage_masks(model, job, batch, share, cov) if bool(beyond[0]))
    kind = "moe" if model.moe is not None else "dense"
    if kind not in cal.get("models", ()):
        out.append(f"{kind} models on {hw.name}: no calibration run")
    return Confidence(not out, tuple(out))


def summarize(runs) -> dict[str, Any]:
    """A calibration mapping from the runs a profile was fitted on (CalibrationRun-like objects:
    model, job, strategy, devices, group)."""
    dtypes, frameworks, kernels, parallelism, models, sources = set(), set(), set(), set(), set(), set()
    pairs = set()
    seqs, devices = [], []
    for r in runs:
        dtypes.add(dtype_label(r.job))
        frameworks.add(r.job.framework)
        if r.job.attention == "flash":
            kernels.add(r.job.kernel)
        used = features(r.strategy, r.job, r.model.moe is not None)
        parallelism |= used
        pairs |= {f"{r.job.framework}:{name}" for name in used}
        models.add("moe" if r.model.moe is not None else "dense")
        sources.add(r.group)
        seqs.append(r.job.seq_length)
        devices.append(r.devices)
    return {"runs": len(seqs), "sources": sorted(sources), "dtypes": sorted(dtypes), "frameworks": sorted(frameworks),
            "attention_kernels": sorted(kernels), "seq_length": [min(seqs), max(seqs)],
            "devices": [min(devices), max(devices)], "parallelism": sorted(parallelism),
            "framework_parallelism": sorted(pairs), "models": sorted(models)}
