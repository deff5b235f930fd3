"""Memory traffic of one optimizer step, in bytes per element of the device's (possibly ZeRO-sharded)
parameters, as each framework runs it; the step is memory-bound (advisor.cost.compute.optimizer_step_s).
Counted per elementwise kernel: what it reads plus what it writes.

* Fused Adam (Transformer Engine / Apex FusedAdam in Megatron-LM, torch.optim's fused=True,
  torchtitan's default implementation "fused"): one pass reading the 16-bit gradient and writing the
  16-bit weight, reading and writing the fp32 master weight and both moments, 28 bytes
  (ADAM_BYTES_PER_PARAM); a profile measured by ``advisor calibrate`` gives its own figure.
* Unfused Adam in PyTorch (torch.optim.adam._single_tensor_adam, the for-loop; the foreach version
  makes the same passes over lists of tensors): param.mul_ for the decoupled weight decay (8),
  exp_avg.lerp_ (12), exp_avg_sq.mul_ (8) and addcmul_ (12), the denominator's sqrt, division and
  add_ (8 each), param.addcdiv_ (16): 80 bytes on fp32 parameters and gradients (FSDP keeps fp32
  shards).
* MindSpore as MindFormers runs it (mindformers v1.3.0, read at its tag; advisor's audit of the
  MindFormers calibration rows), on fp32 parameters and gradients as advisor prices MindSpore plans
  (TrainingJob.grad_reduce_bytes; the MindFormers export writes param_init_type float32):
  - fused: FP32StateAdamWeightDecay (mindformers/core/optim/optim.py) forces MindSpore's
    AdamWeightDecay primitive, which Ascend's AdamWeightDecayUnifyMindIR pass rewrites into one
    in-place AdamApplyOneWithDecay kernel on fp32 tensors: it reads gradient, both moments and
    weight and writes three, 28 bytes.
  - unfused: MindFormers' AdamW (mindformers/core/optim/adamw.py _update_run_op) and Yi's
    AdamWeightDecayX run each operation as its own kernel: 12 elementwise operations and 3 Assign
    over fp32 tensors, 140 bytes.
  - every step also clips the gradients (ClipGradNorm, mindformers/core/clip_grad.py: Square,
    ReduceSum and Mul per parameter, 20) and divides out the loss scale (MFTrainOneStepCell's
    _grad_scale: a Mul, 8), whatever the scale.
  On 16-bit parameters (param_init_type float16, as most MindFormers v1.3.0 configs run) the fused
  update pays casts and copies around its kernel (72 bytes), the unfused one two casts (148), the
  unscale a cast (14) and the accumulation below half its bytes; advisor does not price 16-bit
  MindSpore weights (nor their 16-bit gradient reduction).
  Megatron's and PyTorch's clipping (a fused multi-tensor norm and scale) are not counted.

Gradient accumulation (accumulation_bytes_per_param): MindSpore's parallel pass adds each micro-batch's
gradients into a copy of the weights (MindFormers' MFPipelineWithLossScaleCell: accu_grads cloned from
the weights, mindformers/wrapper/wrapper.py at v1.3.0) with an AssignAdd in the backward whenever the
step has several micro-batches, pipeline stages or accumulation steps (MindSpore's MicroBatchPostProcess
inserts _VirtualAssignAdd, mindspore/ccsrc/frontend/parallel; mindspore/ops/operations/comm_ops.py:
"do AssignAdd in backward"): per micro-batch it reads the sum and the new gradient and writes the sum,
in the weights' dtype (12 bytes on fp32 weights), over the device's whole gradient unless
the parallel optimizer shards it (ZeRO-2 and above: gradient_accumulation_shard). Megatron accumulates
inside the weight-gradient GEMM (gradient_accumulation_fusion), PyTorch's FSDP into its gradient shards;
neither is counted.

SGD and Adagrad are priced with Adam's fused figure (advisor prices their memory, not their step).
"""

from __future__ import annotations

from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob

ADAM_BYTES_PER_PARAM = 2 + 8 + 8 + 8 + 2      # grad read, master r/w, m r/w, v r/w, weight write
TORCH_UNFUSED_ADAM_BYTES = 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16
# MindSpore's kernels on fp32 parameters and gradients (module docstring)
MINDSPORE_FUSED_ADAM_BYTES = 16 + 12                  # AdamApplyOneWithDecay: 4 tensors read, 3 written
MINDSPORE_UNFUSED_ADAM_BYTES = 140                    # 12 elementwise operations and 3 Assign
MINDSPORE_CLIP_BYTES = 8 + 4 + 8                      # Square, ReduceSum, Mul
MINDSPORE_UNSCALE_BYTES = 8                           # Mul by the reciprocal loss scale
MINDSPORE_ACCUMULATE_BYTES = 4 + 4 + 4                # AssignAdd: read the sum and the gradient, write the sum


def bytes_per_param(hw: HardwareProfile, job: TrainingJob | None) -> float:
    """Bytes the job's optimizer step moves per local parameter (module docstring); no job: fused Adam."""
    fused = job is None or job.optimizer_impl == "fused"
    if job is None or job.framework_record.optimizer_step == "torch":
        if fused:
            return hw.device.optimizer_bytes_per_param or ADAM_BYTES_PER_PARAM
        return float(TORCH_UNFUSED_ADAM_BYTES)
    update = MINDSPORE_FUSED_ADAM_BYTES if fused else MINDSPORE_UNFUSED_ADAM_BYTES
    return float(update + MINDSPORE_CLIP_BYTES + MINDSPORE_UNSCALE_BYTES)


def accumulation_bytes_per_param(job: TrainingJob) -> float:
    """Bytes one micro-batch's gradient accumulation moves per accumulated element (module docstring):
    MindSpore's AssignAdd; 0 where the framework accumulates inside its kernels."""
    if job.framework_record.optimizer_step == "torch":
        return 0.0
    return float(MINDSPORE_ACCUMULATE_BYTES)
