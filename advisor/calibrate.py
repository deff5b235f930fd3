"""Measure this machine into a hardware profile (the schema of advisor.specs.hardware).

``advisor calibrate [--backend gloo|nccl] [--nproc N] [--out PROFILE.yaml]`` starts N processes (one
per device: GPUs with nccl, CPU ranks with gloo), each pinned to its share of the cores exactly as
``advisor execute`` runs ranks, and measures, all ranks at once (so shared cores and memory are
contended as in a real run), every figure in repeated rounds spread over the run, keeping the median
of each (a virtual machine's speed drifts over seconds). The rounds stop once every key figure's
rounds agree within ``--spread-target`` (default 10%, after at least 3 rounds), or at a bound
(``--rounds``, default 8, or a time budget); a figure whose rounds disagree by more than 20% is
named in a warning (advisor.calibration.rounds). ``--quick``: one round, fewer sizes.

* matmul throughput at GEMM sizes from 2 MFLOP to a few GFLOP per call, for each dtype the device
  runs (fp32 and bf16 on CPU; fp32, tf32, bf16, fp16 on CUDA): ``peak_tflops`` is the best rate seen and
  ``matmul_efficiency`` the rate at each size over that peak (log-linear in GFLOP per call, as the
  cost model reads it), made non-decreasing in size by a running maximum (fit.monotone_envelope);
* memory bandwidth (a large out-of-place add, counted as two reads and one write) ->
  ``memory_bandwidth_gbps``; the host time of one transformer layer's forward and backward at a
  negligible size, divided by the cost model's kernels per layer -> ``launch_overhead_us`` (eager
  PyTorch's per-operator cost, which dominates small layers);
* all-reduce, all-gather, reduce-scatter and point-to-point send/recv for groups of 2..N ranks at
  message sizes from 4 KiB to 16 MiB (the ranks start each call together; the first calls on a
  group are left out). Each operation gets the (alpha, B) pair that best reproduces its
  measurements through the cost model's own ring formulas (advisor.cost.comm: all-reduce
  2(g-1)/g S/B + 2(g-1) alpha, all-gather and reduce-scatter (g-1)/g S/B + (g-1) alpha,
  point-to-point alpha + S/B), least squares on log time -> the link's ``collectives:``; the
  link's own ``latency_us`` and ``bandwidth_gbps`` are the single pair fitted to all of them;
* on CPU ranks, a two-stage pipeline of trivial chunks under each torch.distributed.pipelining
  schedule -> ``pipeline_action_overhead_us`` (the schedule's host cost per forward or backward
  action, which the cost model adds to every pipeline stage's time per micro-batch);
* AdamW built as the executor builds it, over many tiny tensors -> ``optimizer_overhead_us_per_tensor``,
  and (CPU) over one large tensor, at the measured bandwidth -> ``optimizer_bytes_per_param``;
* (CPU) a one-layer GPT's forward + backward at a working size, less the GEMM and host time the
  cost model predicts from the figures above -> ``memory_efficiency``, the fraction of streaming
  bandwidth its element-wise work reaches; and ``overlaps_communication: false`` (a CPU rank's
  core runs its collectives and its compute in turn).

Every raw figure is kept under ``notes:`` keys of the profile. The result loads with
``advisor.specs.hardware.load_hardware`` and every command takes it with ``--hardware PATH``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from advisor.calibration.fit import (PROBE_BATCH, PROBE_MODEL, efficiency_curve, elementwise_efficiency,
                                     fit_alpha_beta, fit_link, fit_per_op, merge_rounds, pipeline_action_overhead_us,
                                     ring_terms)
from advisor.calibration.probes import COLLECTIVES, PIPELINE_PROBE, layer_host_us, worker_main
from advisor.calibration.profile import build_profile, render_profile, write_profile
from advisor.calibration.rounds import RoundRule, calibration_warnings
from advisor.errors import AdvisorError, InfeasibleError
from advisor.runtime.capacity import capacity_problems
from advisor.runtime.files import temporary_folder
from advisor.runtime.rank import TORCH_PRELOAD

# what a probing rank imports, for the rank starter to import once before it forks the ranks
# (advisor.runtime.starter)
PRELOAD = (*TORCH_PRELOAD, "torch.distributed.pipelining")


__all__ = ["COLLECTIVES", "PIPELINE_PROBE", "PROBE_BATCH", "PROBE_MODEL", "CalibrateOptions", "RoundRule",
           "build_profile", "calibrate", "calibration_warnings", "default_nproc", "efficiency_curve", "elementwise_efficiency", "fit_alpha_beta", "fit_link",
           "fit_per_op", "layer_host_us", "merge_rounds", "pipeline_action_overhead_us", "render_profile",
           "ring_terms", "worker_main", "write_profile"]


@dataclass(frozen=True)
class CalibrateOptions:
    backend: str = "auto"
    nproc: int | None = None
    quick: bool = False
    timeout_s: float = 900.0
    oversubscribe: bool = False       # allow more than RANKS_PER_CORE ranks per core (advisor.runtime.capacity)
    progress: bool = False            # a progress bar on stderr (one step per probe)
    max_rounds: int | None = None     # at most this many rounds (default: RoundRule's; --quick: 1)
    spread_target: float = RoundRule.spread_target   # stop once every key figure's rounds agree within this

    def rule(self) -> RoundRule:
        """The stopping rule of the rounds; their time budget leaves a third of the timeout to the rest."""
        rule = RoundRule.quick() if self.quick else RoundRule()
        if self.max_rounds is not None:
            rule = replace(rule, max_rounds=self.max_rounds, min_rounds=min(rule.min_rounds, self.max_rounds))
        return replace(rule, spread_target=self.spread_target, budget_s=min(rule.budget_s, self.timeout_s * 2 / 3))


# ---- the command ---------------------------------------------------------------------------------
def default_nproc(backend: str) -> int:
    try:
        import torch
        if backend != "gloo" and torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:
        pass
    return max(2, min(os.cpu_count() or 2, 8))


def check_options(options: CalibrateOptions) -> int:
    """The number of ranks, once the options are known to be usable (before any process starts)."""
    if options.backend not in ("auto", "gloo", "nccl"):
        raise AdvisorError(f"--backend must be auto, gloo or nccl, got {options.backend[:40]!r}")
    if options.nproc is not None and options.nproc < 2:
        raise AdvisorError(f"--nproc must be at least 2 (collectives need two ranks), got {options.nproc}")
    if options.max_rounds is not None and not 1 <= options.max_rounds <= 100:
        raise AdvisorError(f"--rounds must be between 1 and 100, got {options.max_rounds}")
    if not (math.isfinite(options.spread_target) and 0 < options.spread_target <= 1):
        raise AdvisorError(f"--spread-target must be a fraction in (0, 1], e.g. 0.1, got {options.spread_target}")
    if not (math.isfinite(options.timeout_s) and options.timeout_s > 0):
        raise AdvisorError(f"the timeout must be a positive number of seconds, got {options.timeout_s}")
    nproc = options.nproc or default_nproc(options.backend)
    problems = capacity_problems(nproc, oversubscribe=options.oversubscribe)
    if problems:
        raise InfeasibleError("refused before starting any process: " + "; ".join(problems))
    return nproc


def calibrate(options: CalibrateOptions, workdir: str | None = None) -> dict[str, Any]:
    """Measure and return the profile mapping. The rank files go to ``workdir`` (kept), or to a
    temporary folder removed however the run ends."""
    from advisor.runtime import progress
    from advisor.runtime.launch import LaunchOptions, launch_module

    nproc = check_options(options)
    rule = options.rule()
    args = ["--worker", "--backend", options.backend, "--min-rounds", str(rule.min_rounds),
            "--max-rounds", str(rule.max_rounds), "--spread-target", repr(rule.spread_target),
            "--budget-s", repr(rule.budget_s)] + (["--quick"] if options.quick else [])
    with temporary_folder("advisor-calibrate-", keep=workdir) as out, \
            progress.bar(options.progress, "calibrating") as update:
        launch_module("advisor.calibrate", args, out,
                      LaunchOptions(nproc=nproc, timeout_s=options.timeout_s, pg_timeout_s=120.0,
                                    backend=options.backend),
                      progress.ranks_progress(update, nproc) if options.progress else None, temporary=workdir is None)
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    return build_profile(ranks, nproc)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.exit(worker_main(sys.argv[1:]))
    sys.exit("use `advisor calibrate`")
