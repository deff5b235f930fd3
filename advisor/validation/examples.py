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

from functools import lru_cache

from advisor.validation.published import load_published_runs, measured_step_time_s
from advisor.validation.accuracy import usable_runs
from advisor.validation.runs import DEVICE_NAMES, model_flops_utilization
from advisor.validation.torchtitan import load_torchtitan_runs

# The nearness of a measured run to an example: model size counts fully, cluster size and sequence
# length half (a judgment: efficiency depends most on the GEMM sizes the model sets).
DEVICES_WEIGHT = SEQUENCE_WEIGHT = 0.5


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
    recompute: str = "none"     # the run's recomputation: its MFU leaves the replayed FLOPs out


@lru_cache(maxsize=1)
def measured_runs() -> tuple[MeasuredRun, ...]:
    """Every measured run with its MFU in advisor's convention (the peak of the run's dtype)."""
    rows = [(r.id, r.model, r.job, r.devices, r.profile, r.measured_tokens_per_s_per_device, r.strategy.recompute)
            for r in list(usable_runs()) + list(load_torchtitan_runs())]
    rows += [(run.id, run.model, run.job, run.devices, run.hardware,
              run.job.tokens_per_step / measured_step_time_s(run) / run.devices, run.parallel.get("recompute", "none"))
             for run in load_published_runs()]
    return tuple(MeasuredRun(name, DEVICE_NAMES[profile], job.dtype == "fp8", model.num_active_params, devices,
                             job.seq_length, model_flops_utilization(model, job.seq_length, tokens, profile, job.dtype),
                             recompute)
                 for name, model, job, devices, profile, tokens, recompute in rows)


def closest_runs(params: float, devices: int, seq_length: int, hardware: str, dtype: str, count: int = 2) -> list[MeasuredRun]:
    """The `count` measured runs nearest to the example (see the module docstring), nearest first."""
    device = DEVICE_NAMES.get(hardware)
    candidates = [r for r in measured_runs() if r.device == device and r.fp8 == (dtype == "fp8")]

    def distance(r: MeasuredRun) -> float:
        return (abs(math.log(r.params / params)) + DEVICES_WEIGHT * abs(math.log(r.devices / devices))
                + SEQUENCE_WEIGHT * abs(math.log(r.seq_length / seq_length)))

    return sorted(candidates, key=distance)[:count]
