"""Per-device memory: weights, gradients, optimizer states, activations, buffers.

Sources:
* Model states: Rajbhandari et al., "ZeRO", SC'20, section 3.1: mixed-precision Adam keeps 2 bytes of
  fp16/bf16 weights, 2 bytes of gradients and K = 12 bytes of fp32 master weights, momentum and
  variance per parameter; ZeRO stage 1 shards the K bytes over the data-parallel group, stage 2 also
  the gradients, stage 3 also the weights. In fp32 training there is no master copy: 4 + 4 + 8 bytes.
  ZeRO-Offload (Ren et al., USENIX ATC'21) keeps the optimizer states in host memory.
* Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  MLSys 2023 (arXiv 2205.05198), section 4 and Table 2. Per layer and micro-batch, in bytes with
  16-bit activations and 1-byte dropout masks: sbh(34 + 5as/h) without parallelism,
  sbh(10 + 24/t + 5as/(ht)) with tensor parallelism t, sbh/t (34 + 5as/h) with sequence parallelism,
  the 5as/h term dropped by selective recomputation (without dropout the masks and the dropout
  output go: sbh(32 + 2as/h)), 2sbh (2sbh/t with SP) kept by full
  recomputation. We keep the paper's per-tensor breakdown (its section 4.1) so GQA (smaller K and V),
  SwiGLU (Megatron's fused bias-SwiGLU saves the concatenated gate/up output, 4sbf, and the down
  projection input, 2sbf) and MoE (top-k copies of the expert MLP activations) follow from the same
  terms. Activations in other dtypes scale by bytes/2 (verified on this machine: see
  shared/notes/torch-distributed-on-cpu.md). Embedding dropout (sbh) on the first stage and the final
  norm, LM-head input and fp32 logits (4sbv/t) on the last stage follow the paper's section 4.3.
* Micro-batches in flight: GPipe keeps all m (Huang et al. 2019); 1F1B keeps min(p - i, m) on stage i
  (Narayanan et al. SC'21); interleaved 1F1B keeps (p - i - 1) * 2 + (v - 1) * p + 1 model chunks on
  stage i (Megatron-LM's schedules.py warm-up count), i.e. a factor (1 + (p-1)/(pv)) on the first
  stage (Korthikanti section 4.2.3).
* Buffers: ZeRO-3 holds the gathered weights of the current and the prefetched layer; data-parallel
  gradient reduction uses 2 buckets of 25 MB (PyTorch DDP's bucket_cap_mb default); sequence
  parallelism's all-gather uses one sbh-sized buffer (Megatron's global memory buffer). Allowance:
  ALLOCATOR_OVERHEAD of the other parts for the caching allocator's fragmentation and the runtime's
  own workspace (an engineering margin, not a measurement: PyTorch's allocator rounds large blocks
  to 2 MiB and reuses them across sizes, so a few percent is typical).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.space.strategy import StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

GIB = 2.0 ** 30
ALLOCATOR_OVERHEAD = 0.05
DDP_BUCKET_BYTES = 2 * 25e6
RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = 0, 1, 2
GPIPE, ONE_F_ONE_B, INTERLEAVED = 0, 1, 2


@dataclass(frozen=True)
class ActivationTerms:
    """One layer's saved activations for one micro-batch on one device, bytes (arrays)."""

    replicated: np.ndarray     # outside the TP region: divided by t only with sequence parallelism
    sharded: np.ndarray        # inside the TP region: divided by t
    attention_core: np.ndarray  # the 5as^2b score/softmax/dropout tensors (dropped by selective recompute)
    layer_input: np.ndarray    # what full recomputation keeps (2sbh, /t with SP)

    def total(self, recompute):
        keep = self.replicated + self.sharded + np.where(recompute == RECOMPUTE_NONE, self.attention_core, 0.0)
        return np.where(recompute == RECOMPUTE_FULL, self.layer_input, keep)

    @property
    def no_recompute(self):
        return self.replicated + self.sharded + self.attention_core


def layer_activation_terms(model: ModelSpec, job: TrainingJob, b: StrategyBatch, moe_layer: bool) -> ActivationTerms:
    """Korthikanti section 4.1, term by term, adapted for GQA, SwiGLU and MoE (see module doc)."""
    scale = job.dtype_bytes / 2.0
    t = b.tp.astype(float)
    sp = b.sequence_parallel
    s_local = job.seq_length / b.cp              # tokens of a sequence on this rank (context parallel)
    sb = s_local * b.micro_batch_size
    h, kv, a = model.hidden_size, model.kv_hidden_size, model.num_attention_heads
    # Attention block: LN input 2sbh, QKV input 2sbh, output dropout mask sbh (outside TP);
    # Q 2sbh, K and V 2sb*kv each, output projection input 2sbh (inside TP).
    mask = 1.0 if job.dropout else 0.0          # 1-byte dropout masks (sbh each)
    rep = 2 * sb * h + 2 * sb * h + mask * sb * h
    shard = 2 * sb * h + 4 * sb * kv + 2 * sb * h
    # Scores: softmax output 2, dropout mask 1, dropout output 2 bytes per score, a heads x s_q x s_k.
    # Flash attention keeps none of them, only the fp32 log-sum-exp per query and head (Dao et al.,
    # FlashAttention, 2022, section 3.1), which selective recomputation has no reason to drop.
    if job.attention == "math":
        # without dropout only the softmax output (2 bytes per score) is kept
        core = (5.0 if job.dropout else 2.0) * a * s_local * job.seq_length * b.micro_batch_size / t
        lse = 0.0
    else:
        core = np.zeros(len(b))
        lse = 4.0 * a * s_local * b.micro_batch_size / t
    # MLP block: LN input 2sbh, FC1 input 2sbh, dropout mask sbh (outside TP).
    rep = rep + 2 * sb * h + 2 * sb * h + mask * sb * h
    if moe_layer and model.moe is not None:
        k, ff = model.moe.top_k, model.moe.expert_ffn_hidden_size
        # Router: fp32 logits/probabilities (4sbE); dispatched token copies (2sbh per chosen expert).
        rep = rep + 4 * sb * model.moe.num_experts + 2 * sb * h * k
        shard = shard + k * _mlp_inner(model, sb, ff)
    else:
        shard = shard + _mlp_inner(model, sb, model.ffn_hidden_size)
    replicated = np.where(sp, rep / t, rep) * scale
    if job.framework == "pytorch":
        # PyTorch's sequence parallelism keeps the all-gathered QKV and FC1 inputs (2sbh each)
        # instead of their 1/t shards.
        replicated = replicated + np.where(sp, 2.0 * (2 * sb * h) * (1.0 - 1.0 / t), 0.0) * scale
    return ActivationTerms(
        replicated=replicated,
        sharded=shard / t * scale + lse,
        attention_core=core * scale,
        layer_input=np.where(sp, 2 * sb * h / t, 2 * sb * h) * scale,
    )


def _mlp_inner(model: ModelSpec, sb, ffn: int):
    """Tensors inside the TP region of one MLP: GELU input and output (2sbf each), or fused SwiGLU's
    gate/up concatenation (4sbf) and the down-projection input (2sbf)."""
    return (6.0 if model.ffn_activation == "swiglu" else 4.0) * sb * ffn


def end_stage_activations(model: ModelSpec, job: TrainingJob, b: StrategyBatch):
    """(first, last) stage extras per micro-batch, bytes: embedding dropout mask; final-norm input,
    LM-head input (2sbh each, /t with SP) and fp32 logits 4sbv/t (Korthikanti section 4.3)."""
    scale = job.dtype_bytes / 2.0
    t = b.tp.astype(float)
    sb = job.seq_length / b.cp * b.micro_batch_size
    h = model.hidden_size
    div = np.where(b.sequence_parallel, t, 1.0)
    first = (sb * h / div * scale) if job.dropout else np.zeros(len(b))
    last = (4 * sb * h / div) * scale + 4.0 * sb * model.vocab_size / t
    if job.framework == "pytorch":
        last = last + np.where(b.sequence_parallel, 2 * sb * h * (1.0 - 1.0 / t), 0.0) * scale  # gathered LM-head input
    return first, last


def stage_layer_counts(model: ModelSpec, b: StrategyBatch):
    """(dense, moe) layer counts per stage, (N, P) arrays; layer j is MoE when (j+1) % freq == 0."""
    layers = b.stage_layers.astype(np.int64)
    if model.moe is None:
        return layers, np.zeros_like(layers)
    end = np.cumsum(layers, axis=1)
    start = end - layers
    freq = model.moe.layer_frequency
    moe = end // freq - start // freq
    return layers - moe, moe


def stage_masks(b: StrategyBatch):
    """(active, first, last) boolean (N, P) masks over the padded stage axis."""
    cols = np.arange(b.stage_layers.shape[1])[None, :]
    pp = b.pp[:, None]
    return cols < pp, cols == 0, cols == pp - 1


def in_flight(b: StrategyBatch):
    """Micro-batches' worth of activations held at the peak on each stage, (N, P) float array."""
    cols = np.arange(b.stage_layers.shape[1])[None, :].astype(float)
    p = b.pp[:, None].astype(float)
    m = b.num_micro_batches[:, None].astype(float)
    v = b.virtual_pipeline_stages[:, None].astype(float)
    sched = b.pipeline_schedule[:, None]
    one_f = np.minimum(p - cols, m)
    # Interleaved: warm-up chunks of L/(pv) layers each, expressed in whole-stage micro-batches.
    chunks = np.minimum((p - cols - 1) * 2 + (v - 1) * p + 1, m * v)
    inter = chunks / v
    return np.select([sched == GPIPE, sched == INTERLEAVED], [np.broadcast_to(m, one_f.shape), inter], one_f)


def stage_params(model: ModelSpec, b: StrategyBatch):
    """(dense, expert) parameters held by one device of each stage, (N, P) float arrays."""
    t = b.tp[:, None].astype(float)
    ep = b.ep[:, None].astype(float)
    dense_layers, moe_layers = stage_layer_counts(model, b)
    active, first, last = stage_masks(b)
    norms = 2 * model.norm_params
    dense = dense_layers * ((model.attention_params + model.mlp_params) / t + norms)
    expert = np.zeros_like(dense)
    if model.moe is not None:
        dense = dense + moe_layers * (model.attention_params / t + norms + model.router_params)
        expert = moe_layers * (model.moe.num_experts / ep) * model.expert_params / t
    vocab = model.vocab_size * model.hidden_size / t
    pos = model.embedding_params - model.vocab_size * model.hidden_size
    embed = np.where(first, vocab + pos, 0.0)
    single = b.pp[:, None] == 1
    head_copy = model.lm_head_params / t if not model.tie_embeddings else vocab
    head = np.where(last, model.norm_params + np.where(single & model.tie_embeddings, 0.0, head_copy), 0.0)
    return np.where(active, dense + embed + head, 0.0), np.where(active, expert, 0.0)


@dataclass(frozen=True)
class MemoryArrays:
    """Per-device bytes on the worst stage, each an (N,) array, and that stage's index."""

    parameters: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    buffers: np.ndarray
    total: np.ndarray
    host_optimizer: np.ndarray
    worst_stage: np.ndarray
    activation_per_microbatch: np.ndarray


def state_bytes_per_param(job: TrainingJob):
    """(weights, gradients, optimizer) bytes per parameter (ZeRO section 3.1)."""
    if job.mixed_precision:
        weights = grads = float(job.dtype_bytes)
        optimizer = 12.0 if job.optimizer in ("adam", "adamw") else 8.0  # fp32 master (+ moments)
    else:
        weights = grads = 4.0
        optimizer = 8.0 if job.optimizer in ("adam", "adamw") else 4.0
    return weights, grads, optimizer


def memory(model: ModelSpec, job: TrainingJob, b: StrategyBatch) -> MemoryArrays:
    dense, expert = stage_params(model, b)
    dp_group = (b.dp * b.cp)[:, None].astype(float)
    ep_group = np.maximum(dp_group / b.ep[:, None], 1.0)
    z = b.zero_stage[:, None]
    wb, gb, ob = state_bytes_per_param(job)

    def sharded(bytes_per, from_stage):
        return bytes_per * (np.where(z >= from_stage, dense / dp_group, dense) + np.where(z >= from_stage, expert / ep_group, expert))

    params = sharded(wb, 3)
    grads = sharded(gb, 2)
    optim_all = sharded(ob, 1)
    offload = b.offload_optimizer[:, None]
    optim = np.where(offload, 0.0, optim_all)

    dense_n, moe_n = stage_layer_counts(model, b)
    recompute = b.recompute[:, None]
    dense_terms = layer_activation_terms(model, job, b, moe_layer=False)
    moe_terms = layer_activation_terms(model, job, b, moe_layer=True)

    def col(x):
        return np.asarray(x)[:, None]

    d_keep = col(dense_terms.total(b.recompute))
    m_keep = col(moe_terms.total(b.recompute))
    d_full = col(dense_terms.no_recompute)
    m_full = col(moe_terms.no_recompute)
    # Full recomputation of only `recompute_layers` layers per stage keeps the rest whole (Megatron's
    # --recompute-method block); recomputing replays one layer at a time, whose full activations are
    # live during its backward.
    # With layers of two sizes (MoE and dense), the layers kept whole are taken to be the larger
    # ones: a bound that does not depend on where the recomputed block falls.
    n_layers = dense_n + moe_n
    limit = np.where(col(b.recompute_layers) < 0, n_layers, np.minimum(col(b.recompute_layers), n_layers))
    full = recompute == RECOMPUTE_FULL
    whole = np.where(full, n_layers - limit, 0)
    m_whole_first = m_full >= d_full
    moe_whole = np.where(m_whole_first, np.minimum(whole, moe_n), np.maximum(whole - dense_n, 0))
    dense_whole = whole - moe_whole
    moe_rc, dense_rc = moe_n - moe_whole, dense_n - dense_whole
    per_mb = np.where(
        full,
        moe_whole * m_full + dense_whole * d_full + moe_rc * m_keep + dense_rc * d_keep,
        dense_n * d_keep + moe_n * m_keep,
    )
    first_x, last_x = end_stage_activations(model, job, b)
    active, first, last = stage_masks(b)
    per_mb = per_mb + np.where(first, col(first_x), 0.0) + np.where(last, col(last_x), 0.0)
    # During the backward of a recomputed layer its full activations are live again, in place of
    # its kept input; the later, non-recomputed layers of that micro-batch are freed by then.
    one_full = np.where(moe_rc > 0, m_full, d_full)
    one_kept = np.where(moe_rc > 0, m_keep, d_keep)
    not_recomputed = moe_whole * m_full + dense_whole * d_full
    replay = np.where(full & (n_layers > 0), np.maximum(one_full - one_kept - not_recomputed, 0.0), 0.0)
    acts = per_mb * in_flight(b) + replay

    layer_max = model.dense_layer_params if model.moe is None else max(model.dense_layer_params, model.moe_layer_params)
    buffers = (
        np.where((z >= 3) & (dp_group > 1), 2.0 * layer_max / col(b.tp) * wb, 0.0)
        + np.where(dp_group > 1, DDP_BUCKET_BYTES, 0.0)
        + np.where(col(b.sequence_parallel), 2.0 * job.seq_length / col(b.cp) * col(b.micro_batch_size) * model.hidden_size * job.dtype_bytes / 2.0, 0.0)
    )
    subtotal = params + grads + optim + acts
    buffers = buffers + ALLOCATOR_OVERHEAD * subtotal
    total = np.where(active, subtotal + buffers, -1.0)
    worst = np.argmax(total, axis=1)
    rows = np.arange(total.shape[0])

    def pick(x):
        return np.broadcast_to(x, total.shape)[rows, worst]

    return MemoryArrays(
        parameters=pick(params), gradients=pick(grads), optimizer=pick(optim), activations=pick(acts),
        buffers=pick(buffers), total=pick(total), host_optimizer=np.max(np.where(offload, optim_all, 0.0), axis=1),
        worst_stage=worst, activation_per_microbatch=pick(per_mb),
    )
