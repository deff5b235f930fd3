"""Saved activations of one layer and micro-batch on one device, tensor by tensor.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023
(arXiv 2205.05198), section 4.1 and Table 2: with 16-bit activations and 1-byte dropout masks a layer
keeps sbh(34 + 5as/h) bytes without parallelism, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t,
sbh/t (34 + 5as/h) with sequence parallelism. The per-tensor breakdown of that section is kept, so
GQA and MLA (other Q, K, V widths), SwiGLU (Megatron's fused bias-SwiGLU saves the concatenated
gate/up output, 4sbf, and the down-projection input, 2sbf), MoE (top-k copies of the expert MLP
activations, the router's fp32 logits, the dispatched tokens) and shared experts follow from the
same terms, and recomputation policies (advisor.cost.recompute) can name what they drop. Other dtypes
scale by bytes/2 (verified on this machine: shared/notes/torch-distributed-on-cpu.md). Flash
attention keeps no score tensors, only the fp32 log-sum-exp per query and head (Dao et al.,
FlashAttention, 2022, section 3.1). PyTorch's sequence parallelism keeps the all-gathered QKV and
FC1 inputs instead of their shards (verified in the same notes). Under FP8, Transformer Engine's
linear layers save their quantized input (1 byte) for the weight-gradient GEMM: the QKV, FC1 and FC2
inputs (and the experts' FC1 input, the dispatched tokens, which TE's GroupedLinear quantizes the
same way) shrink to 1 byte per element, and the output projection's FP8 copy comes on top of the
attention output that flash attention keeps for its own backward (advisor.cost.fp8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost import fp8
from advisor.space.strategy import StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

# Named tensors, by the region tensor parallelism leaves them in.
REPLICATED = ("norm_inputs", "qkv_input", "latents", "fc1_input", "dropout_masks", "router", "dispatched")
SHARDED = ("q", "k", "v", "attention_out", "mlp_inner", "fc2_input", "lse")


@dataclass(frozen=True)
class ActivationTerms:
    """One layer's saved activations for one micro-batch on one device, bytes (arrays).
    ``parts`` names each tensor group (REPLICATED and SHARDED keys, already divided by t where the
    layer divides them); ``attention_core`` is the math attention's score tensors."""

    parts: dict[str, np.ndarray]
    attention_core: np.ndarray   # the 5as^2b score/softmax/dropout tensors (dropped by selective recompute)
    layer_input: np.ndarray      # what full recomputation keeps (2sbh, /t with SP)

    @property
    def replicated(self) -> np.ndarray:
        return sum(self.parts[k] for k in REPLICATED)

    @property
    def sharded(self) -> np.ndarray:
        return sum(self.parts[k] for k in SHARDED)

    @property
    def no_recompute(self) -> np.ndarray:
        return self.replicated + self.sharded + self.attention_core

    def total(self, recompute) -> np.ndarray:
        """Kept bytes under Korthikanti et al.'s policies (0 none, 1 selective, 2 full); other
        frameworks' selective policies: advisor.cost.recompute.kept_bytes."""
        keep = np.where(recompute == 0, self.no_recompute, self.replicated + self.sharded)
        return np.where(recompute == 2, self.layer_input, keep)


def _mlp_inner(model: ModelSpec, sb, ffn: int):
    """(activation-function inputs, down-projection input) of one MLP, in 16-bit elements: GELU input
    2sbf and output 2sbf, or fused SwiGLU's gate/up concatenation 4sbf and its output 2sbf."""
    return (4.0 if model.ffn_activation == "swiglu" else 2.0) * sb * ffn, 2.0 * sb * ffn


def layer_activation_terms(model: ModelSpec, job: TrainingJob, b: StrategyBatch, moe_layer: bool,
                           stored: bool = True) -> ActivationTerms:
    """Korthikanti section 4.1, term by term (see module doc). stored=False gives the tensors at
    their compute-dtype size, ignoring FP8 saved inputs (the memory-bound kernels' traffic)."""
    scale = job.dtype_bytes / 2.0
    t = b.tp.astype(float)
    sp = b.sequence_parallel
    s_local = job.seq_length / b.cp              # tokens of a sequence on this rank (context parallel)
    sb = s_local * b.micro_batch_size
    h, a = model.hidden_size, model.num_attention_heads
    quantized = stored and job.recipe is not None and job.framework_record.quantized_saved_inputs   # TE keeps FP8 inputs
    fp8_input = fp8.saved_input_bytes(job) / 2.0 if quantized else 1.0
    mask = 1.0 if job.dropout else 0.0          # 1-byte dropout masks (sbh each)
    rep = {
        "norm_inputs": 2 * (2 * sb * h),        # the two norms' inputs
        "qkv_input": 2 * sb * h * fp8_input,
        "latents": 2 * sb * (model.mla.q_lora_rank + model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)
        if model.mla is not None else 0.0 * sb,
        "fc1_input": 2 * sb * h * fp8_input,
        "dropout_masks": 2 * mask * sb * h,     # attention-output and MLP-output dropout
        "router": 0.0 * sb,
        "dispatched": 0.0 * sb,
    }
    shard = {
        "q": 2 * sb * model.q_size, "k": 2 * sb * model.k_size, "v": 2 * sb * model.v_size,
        # the output projection's input; under FP8 its quantized copy is kept beside flash's output
        "attention_out": 2 * sb * model.attention_out_size * (1.0 + (fp8_input if quantized else 0.0)),
    }
    if moe_layer and model.moe is not None:
        moe = model.moe
        # Router: fp32 logits/probabilities (4sbE); dispatched token copies (2sbh per chosen expert).
        rep["router"] = 4 * sb * moe.num_experts
        rep["dispatched"] = 2 * sb * h * moe.top_k * fp8_input   # the experts' FC1 input (FP8: TE GroupedLinear keeps it quantized)
        act, down = _mlp_inner(model, sb, moe.expert_ffn_hidden_size)
        act, down = moe.top_k * act, moe.top_k * down
        if moe.shared_ffn:
            shared_act, shared_down = _mlp_inner(model, sb, moe.shared_ffn)
            act, down = act + shared_act, down + shared_down
    else:
        act, down = _mlp_inner(model, sb, model.ffn_hidden_size)
    shard["mlp_inner"] = act
    shard["fc2_input"] = down * fp8_input
    # Scores: softmax output 2, dropout mask 1, dropout output 2 bytes per score, a heads x s_q x s_k
    # (without dropout only the softmax output is kept).
    if job.attention == "math":
        core = (5.0 if job.dropout else 2.0) * a * s_local * job.seq_length * b.micro_batch_size / t * scale
        lse = 0.0 * sb
    else:
        core = np.zeros(len(b))
        lse = 4.0 * a * s_local * b.micro_batch_size / t
    parts = {k: np.where(sp, v / t, v) * scale for k, v in rep.items()}
    if job.framework_record.keeps_gathered_sp_inputs:
        # PyTorch's sequence parallelism keeps the all-gathered QKV and FC1 inputs (2sbh each)
        # instead of their 1/t shards.
        gathered = np.where(sp, 2 * sb * h * (1.0 - 1.0 / t), 0.0) * scale
        parts["qkv_input"] = parts["qkv_input"] + gathered
        parts["fc1_input"] = parts["fc1_input"] + gathered
    parts.update({k: v / t * scale for k, v in shard.items()})
    parts["lse"] = lse + np.zeros(len(b))
    return ActivationTerms(
        parts={k: np.asarray(v, dtype=float) + np.zeros(len(b)) for k, v in parts.items()},
        attention_core=np.asarray(core, dtype=float) + np.zeros(len(b)),
        layer_input=np.where(sp, 2 * sb * h / t, 2 * sb * h) * scale,
    )


def end_stage_activations(model: ModelSpec, job: TrainingJob, b: StrategyBatch):
    """(first, last) stage extras per micro-batch, bytes: embedding dropout mask; final-norm input,
    LM-head input (2sbh each, /t with SP), the logits the loss keeps (Korthikanti section 4.3 counts
    the logits; their bytes per logit: loss_bytes_per_logit)."""
    scale = job.dtype_bytes / 2.0
    t = b.tp.astype(float)
    sb = job.seq_length / b.cp * b.micro_batch_size
    h = model.hidden_size
    div = np.where(b.sequence_parallel, t, 1.0)
    first = (sb * h / div * scale) if job.dropout else np.zeros(len(b))
    last = (4 * sb * h / div) * scale + loss_bytes_per_logit(job)[0] * sb * model.vocab_size / t
    if job.framework_record.keeps_gathered_sp_inputs:
        last = last + np.where(b.sequence_parallel, 2 * sb * h * (1.0 - 1.0 / t), 0.0) * scale  # gathered LM-head input
    return first, last


def loss_bytes_per_logit(job: TrainingJob) -> tuple[float, float]:
    """(bytes per logit kept from the forward to the backward, bytes per logit the loss's backward
    adds while it runs), as each framework computes the cross entropy (the record's loss_logit_bytes; None
    stands for the compute dtype's bytes):
    * megatron: vocab_parallel_cross_entropy casts the logits to fp32 and keeps the fp32 softmax,
      writing the gradient into it in place; the gradient handed back to the LM head is cast to the
      compute dtype (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py): 4 + 2.
    * pytorch (llm-foundry's stack): flash-attn's fused CrossEntropyLoss keeps the logits in the
      compute dtype and writes a gradient of the same dtype (inplace_backward=False; flash_attn
      losses/cross_entropy.py, llm-foundry MPT's default loss_fn "fused_crossentropy"): 2 + 2.
    * torchtitan: F.cross_entropy(pred.float(), labels) in eager mode keeps log_softmax's fp32 output;
      its backward holds nll_loss's dense fp32 gradient and log_softmax's fp32 result together
      (torchtitan train.py at 9dec370): 4 + 8.
    * mindspore: fp32 logits and an fp32 gradient (MindFormers' CrossEntropyLoss computes in fp32;
      not verified tensor by tensor): 4 + 4."""
    compute = float(job.dtype_bytes)
    kept, added = job.framework_record.loss_logit_bytes
    return (compute if kept is None else kept, compute if added is None else added)


def logits_gradient_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """What the loss's backward adds (loss_bytes_per_logit), live once during the last stage's backward (not per micro-batch in flight)."""
    return loss_bytes_per_logit(job)[1] * job.seq_length / b.cp * b.micro_batch_size * model.vocab_size / b.tp.astype(float)
