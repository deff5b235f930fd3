"""`recommend` on the README's and the issue's examples, next to the closest measured run.

The closest measured run is taken among every measured run advisor has (the calibration set, the
Megatron-LM papers, torchtitan's tables) on the same device and in the same precision class (FP8 or
16-bit): the one nearest in model size, cluster size and sequence length (distance = |log parameter ratio| +
0.5 |log device ratio| + 0.5 |log sequence ratio|). Its MFU is computed in advisor's convention (model FLOPs of
ModelSpec.training_flops_per_token, causal attention halved, over the peak of the run's dtype), so
the two figures compare like with like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.published import load_published_runs, sc21_flops_per_step
from advisor.specs.hardware import load_hardware
from advisor.validation.accuracy import usable_runs
from advisor.validation.runs import DEVICE_NAMES
from advisor.validation.torchtitan import load_torchtitan_runs

PUBLISHED_PROFILES = {"selene-a100-80g": "dgx-a100-80g"}


@dataclass(frozen=True)
class Example:
    model: str
    hardware: str
    devices: int
    dtype: str
    global_batch: int | None = None

    @property
    def command(self) -> str:
        batch = f" --global-batch {self.global_batch}" if self.global_batch else ""
        return (f"advisor recommend --model {self.model} --hardware {self.hardware} --devices {self.devices}"
                f" --dtype {self.dtype}{batch}")


EXAMPLES = (
    Example("llama3-70b", "dgx-h100", 64, "bf16"),
    Example("llama3-70b", "dgx-h100", 64, "fp8"),
    Example("llama3-8b", "dgx-a100-80g", 8, "bf16"),
    Example("mt-nlg-530b", "dgx-a100-80g", 5120, "fp16", 2560),
    Example("gpt3-175b", "dgx-b200", 1024, "fp8"),
)


@dataclass(frozen=True)
class MeasuredRun:
    id: str
    device: str
    fp8: bool
    params: float
    devices: int
    seq_length: int
    mfu: float


def _mfu(model, seq: int, tokens_per_s_per_device: float, profile: str, dtype: str) -> float:
    peak = load_hardware(profile).device.peak_flops(dtype)
    return model.training_flops_per_token(seq) * tokens_per_s_per_device / peak


def measured_runs() -> list[MeasuredRun]:
    out = []
    for r in list(usable_runs()) + list(load_torchtitan_runs()):
        out.append(MeasuredRun(r.id, DEVICE_NAMES[r.profile], r.job.dtype == "fp8", r.model.num_active_params, r.devices, r.job.seq_length,
                               _mfu(r.model, r.job.seq_length, r.measured_tokens_per_s_per_device, r.profile, r.job.dtype)))
    for run in load_published_runs():
        profile = PUBLISHED_PROFILES.get(run.hardware, run.hardware)
        if "iteration_time_s" in run.measured:
            step_s = run.measured["iteration_time_s"]
        else:   # SC'21 publishes TFLOP/s on its own FLOP count: back to the step time
            step_s = sc21_flops_per_step(run) / (run.measured["hfu_tflops"] * 1e12 * run.devices)
        tokens = run.job.tokens_per_step / step_s / run.devices
        out.append(MeasuredRun(run.id, DEVICE_NAMES[profile], False, run.model.num_active_params, run.devices,
                               run.job.seq_length, _mfu(run.model, run.job.seq_length, tokens, profile, run.job.dtype)))
    return out


def closest_runs(params: float, devices: int, seq_length: int, hardware: str, dtype: str, count: int = 2) -> list[MeasuredRun]:
    """The `count` measured runs nearest to the example (see the module docstring), nearest first."""
    device = DEVICE_NAMES.get(hardware)
    candidates = [r for r in measured_runs() if r.device == device and r.fp8 == (dtype == "fp8")]

    def distance(r: MeasuredRun) -> float:
        return (abs(math.log(r.params / params)) + 0.5 * abs(math.log(r.devices / devices))
                + 0.5 * abs(math.log(r.seq_length / seq_length)))

    return sorted(candidates, key=distance)[:count]
