"""Which constants are fitted for which device, and on which measured runs.

Starting values: the GEMM scale 0.86 is the framework-efficiency scale fitted on A100 against
Megatron-LM (benchmarks/accuracy.py before this fit); memory efficiencies are the BabelStream-class
fractions in each profile's comments; 30 us per launch is the A100 vTrain calibration; link
efficiencies are NCCL-tests bus bandwidth over peak (profile comments). Attention scales start at 1
for the kernel a shape was measured with, and at 0.6 for kernels without their own measurement
(flash-attn 1.x's Triton kernel ran at about 0.6 of FlashAttention-2 on A100 in the FA2 repo's
benchmark: 90-100 vs 150-200 TFLOP/s at head dim 64).

Blackwell's BF16 GEMM scale is held at H100's (see h100_bf16_scale); Blackwell Ultra (B300) starts from
the Blackwell fit and refits only its FP8 GEMM scale (see its target). A100's launch overhead and the size
axis of its GEMM curve stay where the vTrain calibration put them (the ranking of 1,440 small
single-node runs, whose small GEMMs and host-bound layers decide both, not the large runs' throughput
errors), and the attention curves of kernels it has no runs for (te, sdpa) stay at
their measured FlashAttention-2 shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.validation.published import load_published_runs, measured_step_time_s, paper_source, predict as predict_published
from advisor.space.strategy import Strategy
from advisor.specs.hardware import load_hardware
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec
from advisor.validation.accuracy import predict, usable_runs
from advisor.validation.fit import PROFILE_SEPARATOR, Constant, Observation, Target, evaluate, fit, shape_scale, shapes
from advisor.validation.runs import CalibrationRun


def _c(name, start, low, high, log=True):
    return Constant(name, start, low, high, log)


# Bounds (method choices, wide of every physical value): GEMM scales 0.4-1.25 of the starting shape
# (whose top points are 0.78-0.85 of peak); the size factor within 2x either way (the shape's basis, a
# few microseconds of launch and prologue per call and tile/wave quantization, places the work at which
# a GEMM reaches a given efficiency to within about that); attention scales
# 0.2-1.5; memory-bound efficiency 0.55-0.95 (STREAM-class kernels reach 0.8-0.9 of HBM bandwidth,
# small unfused ones ~0.6: below that the constant would stand for unpriced work); launch overhead
# 2-120 us (PyTorch's profiler shows 10-40 us per eager op); link efficiency 0.3-1.0.
GEMM = (_c("gemm_scale.bf16", 0.86, 0.4, 1.25), _c("gemm_size_factor", 1.0, 0.5, 2.0))


def peak_ratio(profile: str, shape_profile: str = "dgx-h100") -> float:
    """What the size factor of a device whose GEMM curves start from another device's measured shape
    is relative to: the same fixed microseconds per GEMM are r times the work on a device r times
    faster, r the ratio of the profiles' BF16 peaks (datasheet figures, not fitted)."""
    return load_hardware(profile).device.peak_flops("bf16") / load_hardware(shape_profile).device.peak_flops("bf16")


BLACKWELL = ("dgx-b200", "gb200-nvl72")


def h100_bf16_scale() -> float:
    """Blackwell's BF16 runs are three MoE rows (gpt-oss-120B on both systems, DeepSeek-V3 on GB200),
    which cannot fix a GEMM curve: BF16 takes the H100 fit's scale (read from the bundled dgx-h100
    profile), and the confidence report says so."""
    return shape_scale("dgx-h100", "bf16", "gemm_h100")


# Blackwell Ultra: DGX B300 and GB300 NVL72 carry the same B300 GPU, fitted together as Blackwell's
# systems are; each system's host is its Blackwell counterpart's (an x86 DGX host, a Grace superchip)
BLACKWELL_ULTRA = ("dgx-b300", "gb300-nvl72")
SAME_HOST = {"dgx-b300": "dgx-b200", "gb300-nvl72": "gb200-nvl72"}


def carried_constant(target: Target, profile: str, name: str) -> float:
    """A constant of `target`'s fit as its bundled profile `profile` carries it (the inverse of
    fit.profile_raw for one name): a GEMM scale or attention scale over the target's starting shape
    (its best point over the shape's), the size factor over the shape's size axis and the profile's
    size base, and the plain device values (memory-bound efficiency, launch overhead)."""
    dev = load_hardware(profile).device
    key, _, which = name.partition(".")
    if key == "gemm_scale":
        return shape_scale(profile, which, target.gemm_shape)
    if key == "gemm_size_factor":
        base = target.size_base.get(profile)
        return dev.gemm_curve("bf16")[0][0] / shapes()[target.gemm_shape][0][0] / (base() if base else 1.0)
    if key == "attention_scale" and which in target.attention_shapes:
        return max(y for _, y in dev.attention_curve(which)) / max(y for _, y in shapes()[target.attention_shapes[which]])
    if name in ("memory_efficiency", "launch_overhead_us"):
        return float(getattr(dev, name))
    raise ValueError(f"fit target {target.device}: cannot read constant {name!r} back from profile {profile!r}")


TARGETS = {
    "A100": Target(
        device="A100", profiles=("dgx-a100-80g", "dgx-a100-40g"), gemm_shape="gemm_a100",
        attention_shapes={"te": "fa2_a100", "sdpa": "fa2_a100", "triton": "fa2_a100"},
        constants=GEMM[:1] + (_c("attention_scale.triton", 0.6, 0.2, 1.3), _c("memory_efficiency", 0.80, 0.55, 0.95)),
        fixed={"launch_overhead_us": 30.0, "gemm_size_factor": 1.0},
    ),
    "H100": Target(
        device="H100", profiles=("dgx-h100", "dgx-h200"), gemm_shape="gemm_h100",
        attention_shapes={"te": "cudnn_h100", "sdpa": "fa2_h100", "triton": "fa2_h100"},
        # te's shape is cuDNN's forward on H100 (starting_curves.yaml): forward and backward together
        # run no faster per FLOP than the forward alone (the backward is the slower pass), so 1.0 bounds it
        # and the largest BF16 GEMMs reach at least 0.6 of peak inside a framework (0.6 / the shape's
        # 0.78 = 0.769, rounded up; tests/test_hardware.py holds every profile to it)
        constants=(_c("gemm_scale.bf16", 0.86, 0.77, 1.25),) + GEMM[1:] + (
                          _c("gemm_scale.fp8", 0.86, 0.3, 1.25), _c("attention_scale.te", 1.0, 0.3, 1.0),
                          _c("attention_scale.sdpa", 1.0, 0.3, 1.5), _c("attention_scale.triton", 0.6, 0.2, 1.5),
                          _c("memory_efficiency", 0.85, 0.55, 0.95), _c("launch_overhead_us", 30.0, 2.0, 120.0),
                          _c("inter_efficiency", 0.85, 0.3, 1.0)),
        fp8=True,
    ),
    # Blackwell: DGX B200 and GB200 NVL72 carry the same B200 GPU (GB200: two of them with a Grace CPU,
    # at a higher power limit, which their datasheet peaks hold), so the GPU's constants are fitted on
    # both systems' runs together, and each system keeps its own host launch overhead (x86 host in DGX
    # B200, Grace in GB200). Transformer Engine's cuDNN attention (te) starts from the H100 cuDNN shape;
    # the GEMM curves from the H100 shape, stretched along the size axis by the fitted factor times each
    # system's BF16 peak ratio to H100 (2.27 for B200, 2.53 for GB200; peak_ratio), within 2x of it.
    "Blackwell": Target(
        device="Blackwell", profiles=BLACKWELL, gemm_shape="gemm_h100", attention_shapes={"te": "cudnn_h100"},
        constants=(_c("gemm_size_factor", 1.0, 0.5, 2.0), _c("gemm_scale.fp8", 0.86, 0.3, 1.25),
                   _c("attention_scale.te", 1.0, 0.3, 1.5), _c("memory_efficiency", 0.80, 0.55, 0.95))
        + tuple(_c(f"launch_overhead_us{PROFILE_SEPARATOR}{p}", 30.0, 2.0, 120.0) for p in BLACKWELL),
        fp8=True, fixed={"gemm_scale.bf16": h100_bf16_scale},
        size_base={p: (lambda p=p: peak_ratio(p)) for p in BLACKWELL},
    ),
    # Blackwell Ultra (B300): new silicon of the same architecture (the same dense BF16/FP8 tensor
    # throughput per the HGX B300 table, twice the special-function throughput for attention's
    # exponentials per NVIDIA's Blackwell Ultra material, 288 GB of HBM3e, 1400 W in GB300), so its
    # constants start where the Blackwell fit left them (read from the bundled dgx-b200 profile when a fit
    # starts: predicting at the starting constants is predicting B300 from the B200 runs). Only the FP8
    # GEMM scale is refitted: its fourteen runs, nine of them FP8 on GB300, do not tell attention from
    # GEMM efficiency apart (fitted together, the attention scale fell from 1.17 to 0.47 while the
    # FP8 scale rose to 1.06: a trade between the two, and opposite to the doubled exponential
    # throughput), so the size factor, attention and memory-bound efficiency stay the Blackwell fit's,
    # each system's launch overhead its Blackwell counterpart's (the same host), BF16 at H100's scale.
    "Blackwell-Ultra": Target(
        device="Blackwell-Ultra", profiles=BLACKWELL_ULTRA, gemm_shape="gemm_h100", attention_shapes={"te": "cudnn_h100"},
        constants=(_c("gemm_scale.fp8", lambda: _blackwell("dgx-b200", "gemm_scale.fp8"), 0.3, 1.25),),
        fp8=True,
        fixed={"gemm_scale.bf16": h100_bf16_scale,
               **{name: (lambda name=name: _blackwell("dgx-b200", name))
                  for name in ("gemm_size_factor", "attention_scale.te", "memory_efficiency")},
               **{f"launch_overhead_us{PROFILE_SEPARATOR}{p}": (lambda p=p: _blackwell(SAME_HOST[p], "launch_overhead_us"))
                  for p in BLACKWELL_ULTRA}},
        size_base={p: (lambda p=p: peak_ratio(p)) for p in BLACKWELL_ULTRA},
    ),
    # the largest BF16 GEMMs reach at least 0.6 of peak inside a framework, as for H100 (0.6 / the
    # gemm_910b shape's 0.85 = 0.706)
    "910B": Target(
        device="910B", profiles=("ascend-910b",), gemm_shape="gemm_910b", attention_shapes={"npu": "fa2_a100"},
        constants=(_c("gemm_scale.bf16", 0.86, 0.706, 1.25),) + GEMM[1:] + (
            _c("attention_scale.npu", 0.6, 0.2, 1.5), _c("memory_efficiency", 0.80, 0.55, 0.95)),
    ),
}


def _blackwell(profile: str, name: str) -> float:
    """A constant of the Blackwell fit as a bundled Blackwell profile carries it (Blackwell Ultra's start)."""
    return carried_constant(TARGETS["Blackwell"], profile, name)


def calibration_observation(run: CalibrationRun) -> Observation:
    return Observation(run.group, run.profile, lambda hw: math.log1p(predict(run, hw).error))


def _paper_observations() -> list[Observation]:
    """Korthikanti et al. 2022 (iteration times) and SC'21 (TFLOP/s on the paper's own count)."""
    out = []
    for run in load_published_runs():
        def log_error(hw, run=run):
            return math.log(measured_step_time_s(run) / predict_published(run, hw).step_time_s)

        out.append(Observation(paper_source(run), run.hardware, log_error))
    return out


@dataclass(frozen=True)
class FittedRun:
    """What advisor.cost.confidence.summarize reads of a run a device was fitted on."""

    model: ModelSpec
    job: TrainingJob
    strategy: Strategy
    devices: int
    group: str


def fitted_runs(target: Target) -> list[FittedRun]:
    """The runs behind the target's fit (calibration runs, and for A100 the papers' runs)."""
    out = [FittedRun(r.model, r.job, r.strategy, r.devices, r.group) for r in usable_runs() if r.profile in target.profiles]
    if target.device == "A100":
        for run in load_published_runs():
            out.append(FittedRun(run.model, run.job, predict_published(run).strategy, run.devices, paper_source(run)))
    return out


def observations(target: Target, leave_out: str | None = None) -> list[Observation]:
    """Every measured figure on the target's device, without the source `leave_out`."""
    obs = [calibration_observation(r) for r in usable_runs() if r.profile in target.profiles]
    if target.device == "A100":
        obs += _paper_observations()
    return [o for o in obs if o.source != leave_out]


def fit_per_machine(target: Target, evaluations: int = 60) -> dict[str, tuple[dict[str, float], list[float]]]:
    """Where the target's calibration runs come from machines its profiles do not tell apart (910B:
    Atlas 800T A2 and Atlas 900 A2 PoDc), the target fitted on each machine's runs alone: machine ->
    (fitted constants, errors). How much of a device's error is the machines differing."""
    runs = [r for r in usable_runs() if r.profile in target.profiles]
    by_machine: dict[str, list[CalibrationRun]] = {}
    for r in runs:
        by_machine.setdefault(r.machine, []).append(r)
    out = {}
    for machine, members in sorted(by_machine.items()):
        result = fit(target, [calibration_observation(r) for r in members], evaluations)
        out[machine] = (result.values, [e for errors in result.errors.values() for e in errors])
    return out


def leave_one_source_out(target: Target, evaluations: int = 60) -> dict[str, list[float]]:
    """Each source's errors (pred / meas - 1) under a refit of the target without that source; a
    source that is the device's only one is predicted from the starting constants."""
    obs = observations(target)
    out = {}
    for source in sorted({o.source for o in obs}):
        rest = observations(target, leave_out=source)
        values = fit(target, rest, evaluations).values if rest else {}
        out[source] = evaluate(target, [o for o in obs if o.source == source], values)[source]
    return out


def starting_errors(target: Target) -> dict[str, list[float]]:
    """Each source's errors (pred / meas - 1) at the target's starting constants, before any of its
    runs is fitted: for Blackwell Ultra, its runs predicted from the Blackwell fit."""
    return evaluate(target, observations(target), {})
