"""Communication fusion: data-parallel gradients reduced in buckets, overlapped with the backward.

Frameworks fuse the per-parameter gradient collectives into buckets and launch a bucket's
collective once all of its gradients are computed, while the backward goes on (PyTorch DDP: Li et
al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020, sections
3.2.3 (gradient bucketing, overlap) and 5 (the bucket-size study: small buckets pay many launches,
large ones leave a long tail after the backward); Megatron-Core DistributedDataParallel; DeepSpeed
ZeRO reduce_bucket_size / allgather_bucket_size; MindSpore comm_fusion, docs mirror
tutorials/source_en/parallel/comm_fusion.md: "while the next group of parameters is computed, the
communication of the previous group of parameters is carried out").

Model, per device (the largest pipeline stage's gradients, G bytes), for a bucket size S:
* n = ceil(G / S) buckets, each one collective: t_b = the alpha-beta time (advisor.cost.comm) of
  G / n bytes, i.e. the bandwidth term divided by n plus a whole collective start-up per bucket.
* The window (the last micro-batch's backward for gradient reductions, T long) produces gradients
  at an even rate, so bucket i (1..n) is ready at i T / n. One communication stream serves the
  buckets in order: f_i = max(i T / n, f_(i-1)) + t_b, hence the last one ends at
  max_k (k T / n + (n - k + 1) t_b) = max(T / n + n t_b, T + t_b) (an affine function of k is
  largest at an end), and what stays exposed after the window is
      exposed = max(n t_b - T (1 - 1/n), t_b).
  One bucket (n = 1) waits for the whole backward: n t_b exposed. Without overlap every bucket
  waits: n t_b.
* The same holds for Megatron's bucketed parameter all-gather overlapped with the next forward
  (--overlap-param-gather: bucket i is needed at (i - 1) F / n, the mirror image).

How it enters the step time (advisor.cost.data_parallel): the calibrated data-parallel model
prices each collective as one, overlapped with the whole window (the lower envelope of the bucket
model: exposed(S) >= max(T + alpha - window, 0) for every S), and the calibration set was fitted
with it. Pricing the framework defaults with the bare bucket model instead moves 15 of the 333
calibration runs by more than 0.1% (up to 4.1%; the set's MAPE stays 8.7%), so the defaults keep the
calibrated figure and a candidate's own size S moves it by the bucket model's difference
exposed(S) - exposed(framework default), never below what S's last bucket alone leaves exposed
(which no overlap hides) unless the calibrated figure is lower still. The default size (or
``grad_bucket_mb`` 0, None in a Strategy) reproduces every earlier figure exactly. Only ZeRO-0/1
take a bucket size: ZeRO-2/3 reduce per wrapped unit (FSDP units).
"""

from __future__ import annotations

import numpy as np

from advisor.space.strategy import StrategyBatch
from advisor.specs.job import TrainingJob

MIB = 2.0 ** 20
# Bucket sizes the search tries (MiB): PyTorch DDP's default 25 (bucket_cap_mb), MindSpore's
# comm_fusion "auto" threshold 64, and sizes around Megatron's default (40M parameters = 160 MB of
# fp32 gradients) and DeepSpeed's (5e8 elements) up to 500.
BUCKET_CHOICES_MB = (25.0, 40.0, 64.0, 100.0, 200.0, 500.0)
# The frameworks' default buckets are their records' bucket_params (Megatron-Core:
# DistributedDataParallelConfig.bucket_size, max(40e6, 1e6 x dp) parameters) or bucket_mb (PyTorch
# DDP's bucket_cap_mb 25; MindSpore comm_fusion's "auto" threshold, 64 MB); DeepSpeed's
# reduce_bucket_size / allgather_bucket_size default is 5e8 elements (deepspeed/runtime/zero/config.py).


def default_bucket_bytes(job: TrainingJob, dp_size) -> np.ndarray:
    """The framework's default gradient bucket in bytes (for reports and exports)."""
    dp_size = np.asarray(dp_size, dtype=float)
    fw = job.framework_record
    if fw.bucket_params is not None:
        params = np.maximum(fw.bucket_params, fw.bucket_params_per_dp_rank * dp_size)
        return params * job.grad_reduce_bytes
    return np.full(dp_size.shape, fw.bucket_mb * MIB)


def explicit(b: StrategyBatch) -> np.ndarray:
    """Candidates with a bucket size of their own (the others keep the framework's default)."""
    return b.grad_bucket_mb > 0


def bucket_count(grad_bytes, bucket_mb) -> np.ndarray:
    """Buckets holding grad_bytes at bucket_mb MiB each (at least one)."""
    size = np.maximum(np.asarray(bucket_mb, dtype=float), 1e-9) * MIB
    return np.maximum(np.ceil(np.asarray(grad_bytes, dtype=float) / size), 1.0)


def exposed_s(bucket_s, n, window_s, overlapped) -> np.ndarray:
    """Seconds the n bucketed collectives (bucket_s each) stay exposed after a compute window of
    window_s that produces (or, mirrored, consumes) their data at an even rate; overlapped False:
    they all run after it."""
    bucket_s = np.asarray(bucket_s, dtype=float)
    n = np.asarray(n, dtype=float)
    total = n * bucket_s
    if not overlapped:
        return total
    return np.maximum(total - np.asarray(window_s, dtype=float) * (1.0 - 1.0 / n), bucket_s)


def buffer_bytes(b: StrategyBatch, default_bytes: float) -> np.ndarray:
    """Communication buffers of the reduction: two buckets in flight (one filled while the other is
    reduced: DeepSpeed allocates two reduce_bucket_size buffers under overlap_comm,
    deepspeed/runtime/zero/stage_1_and_2.py; advisor.cost.memory's default counts DDP's two 25 MB
    buckets the same way); default_bytes where the framework's default buckets are kept."""
    return np.where(explicit(b), 2.0 * b.grad_bucket_mb * MIB, default_bytes)
