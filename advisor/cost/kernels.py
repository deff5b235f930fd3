"""Memory traffic of a layer's memory-bound kernels, fused or eager, per micro-batch on one device.

Norms, rotary embeddings, activation functions, residual adds, dropout and MoE routing move data
without much arithmetic; their time is bytes over the achievable memory bandwidth. How many bytes
depends on how the framework runs them (bytes per token below for 16-bit activations; h hidden, q/k
the query/key widths, f the MLP width; the backward moves twice the forward's):

* fused (Megatron-Core with Transformer Engine, MindSpore graph mode, torch.compile): one kernel per
  operation that reads its inputs once and writes its output once: norm 2h read + 2h write = 4h;
  rotary 4(q + k) (Megatron's apply_rope_fusion); SwiGLU 4f read + 2f write = 6f (bias_swiglu);
  bias-GELU 4f; residual add 6h (2 reads, 1 write; Megatron's fused bias-dropout-add, which also
  writes the 1-byte dropout mask); cross entropy over the logits 12 bytes each (fp32 logits written,
  read, gradient written: Megatron's fused vocab-parallel cross entropy).
* eager (PyTorch without compilation, as llm-foundry's 2023 tables, torchtitan without
  --compile and advisor's executor run):
  every operator is a kernel of its own. F.layer_norm is one kernel (4h); RMSNorm as Llama's
  reference code and torch.nn.RMSNorm decompose it (x.float(), pow(2).mean(), rsqrt, multiply,
  type_as, times the weight) moves about 32h; rotary through complex floats (x.float(),
  view_as_complex, multiply, type_as) 20 bytes per query/key element; SiLU then Mul 10f; GELU 4f;
  dropout 5 bytes per element (read, output, 1-byte mask); cross entropy in fp32 about 24 bytes per
  logit (cast to fp32, log-softmax, gather, and the same backward).
* Both: MoE routing (router softmax and top-k in fp32, about 12 bytes per expert score) and the
  permutation of token copies to and from the experts (read and write 2h per copy, each way).
"""

from __future__ import annotations

import numpy as np

from advisor.space.strategy import StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec


def fused(job: TrainingJob) -> bool:
    """Whether the job's framework fuses its memory-bound kernels (see the module docstring)."""
    return job.fused_kernels if job.fused_kernels is not None else job.framework_record.fused_kernels


def layer_forward_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch, moe_layer: bool) -> np.ndarray:
    """Forward memory traffic of one layer's memory-bound kernels, one micro-batch, one device."""
    on = fused(job)
    scale = job.dtype_bytes / 2.0
    t = b.tp.astype(float)
    tokens = b.micro_batch_size * job.seq_length / b.cp
    h = model.hidden_size
    norm = 4.0 * h if (on or model.norm == "layernorm") else 32.0 * h
    replicated = 2.0 * norm + 2.0 * 6.0 * h
    if job.dropout:
        replicated += 2.0 * (1.0 if on else 5.0) * h
    if model.mla is not None:
        latent = model.mla.q_lora_rank + model.mla.kv_lora_rank
        replicated += latent * (4.0 if on else 32.0)
    sharded = 0.0
    if model.position_embedding == "rotary":
        sharded += (4.0 if on else 20.0) * (model.q_size + model.k_size)
    if moe_layer and model.moe is not None:
        moe = model.moe
        replicated += 12.0 * moe.num_experts + 2.0 * 4.0 * h * moe.top_k
    per_device = np.where(b.sequence_parallel, replicated / t, replicated) + sharded / t
    return tokens * per_device * scale + activation_bytes(model, job, b, moe_layer)


def activation_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch, moe_layer: bool) -> np.ndarray:
    """Forward memory traffic of the MLP activation function (SwiGLU's SiLU and Mul, or GELU), one
    micro-batch, one device: what recomputing the activation replays."""
    scale = job.dtype_bytes / 2.0
    tokens = b.micro_batch_size * job.seq_length / b.cp
    if moe_layer and model.moe is not None:
        widths = model.moe.top_k * model.moe.expert_ffn_hidden_size + model.moe.shared_ffn
    else:
        widths = model.ffn_hidden_size
    per_element = (6.0 if fused(job) else 10.0) if model.ffn_activation == "swiglu" else 4.0
    return tokens * per_element * widths / b.tp.astype(float) * scale


def loss_traffic_per_logit(job: TrainingJob) -> float:
    """Memory traffic of the cross entropy per logit, forward and backward."""
    return 12.0 if fused(job) else 24.0
