"""Per-device memory: weights, gradients, optimizer states, activations, buffers.

Sources:
* Model states: Rajbhandari et al., "ZeRO", SC'20, section 3.1: mixed-precision Adam keeps 2 bytes of
  fp16/bf16 weights, 2 bytes of gradients and K = 12 bytes of fp32 master weights, momentum and
  variance per parameter; ZeRO stage 1 shards the K bytes over the data-parallel group, stage 2 also
  the gradients, stage 3 also the weights. In fp32 training there is no master copy: 4 + 4 + 8 bytes.
  Megatron-Core accumulates and reduces BF16 models' gradients in an FP32 buffer (main_grad):
  2 + 4 + 12 bytes (Megatron-LM docs/source/api-guide/dist_optimizer.md, "bf16 param, fp32 grads:
  6 + 12/d"), or in BF16 where the run says so (grad_reduce_in_fp32 = False); FP16 models' fp32
  gradient copy exists only during the optimizer step, when activations are freed. ZeRO-Offload (Ren et al., USENIX ATC'21) keeps the optimizer
  states in host memory. Under FP8 the cached FP8 weights add 2 bytes per linear-layer parameter
  (advisor.cost.fp8).
* Activations: advisor.cost.activations (per tensor) and advisor.cost.recompute (what each
  framework's recomputation keeps).
* Micro-batches in flight: GPipe keeps all m (Huang et al. 2019); 1F1B keeps min(p - i, m) on stage i
  (Narayanan et al. SC'21); interleaved 1F1B keeps (p - i - 1) * 2 + (v - 1) * p + 1 model chunks on
  stage i (Megatron-LM's schedules.py warm-up count), i.e. a factor (1 + (p-1)/(pv)) on the first
  stage (Korthikanti section 4.2.3).
* Buffers: ZeRO-3/FSDP holds the gathered weights of the current and the prefetched unit (one layer
  each: FSDP2 prefetches one unit ahead in forward and backward, PyTorch fully_shard docs), except
  where it keeps a stage's weights gathered for the step (torchtitan under pipeline parallelism:
  reshard_after_forward is off, torchtitan/distributed/fsdp.py, and PyTorch's pipelining stage turns
  off reshard_after_backward and gradient sync until the last micro-batch's backward,
  torch/distributed/pipelining/stage.py backward_maybe_with_nosync): then the whole stage's weights
  are held unsharded and its gradients accumulate unsharded in the reduction dtype (FSDP2 upcasts
  the unsharded gradient to reduce_dtype to accumulate it); ZeRO-2/3
  hold the unsharded gradients of the unit being reduced, in the reduction dtype (fp32: torchtitan's
  MixedPrecisionPolicy reduce_dtype, Megatron-FSDP's fp32 main grads); data-parallel gradient
  reduction uses 2 buckets of 25 MB (PyTorch DDP's bucket_cap_mb default; a candidate's own bucket
  size, 2 of those: advisor.cost.fusion); sequence parallelism's
  all-gather uses one sbh-sized buffer (Megatron's global memory buffer). Activations add the last
  stage's fp32 logits gradient (advisor.cost.activations). Allowance: ALLOCATOR_OVERHEAD of the other parts for
  the caching allocator's reserved-over-allocated memory and the runtime's own workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.cost import dataset, fp8, fusion, swap
from advisor.cost.activations import end_stage_activations, layer_activation_terms, logits_gradient_bytes
from advisor.cost.recompute import kept_bytes
from advisor.cost.per_batch import cached
from advisor.space.strategy import GPIPE, INTERLEAVED, RECOMPUTE_NONE, StrategyBatch
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

GIB = 2.0 ** 30
ALLOCATOR_OVERHEAD = 0.05
DDP_BUCKET_BYTES = 2 * 25e6


def resharding(job: TrainingJob, b: StrategyBatch) -> np.ndarray:
    """Whether ZeRO-3 frees the gathered weights after each micro-batch's forward (True) or keeps
    them for the step (PyTorch FSDP2 under pipeline parallelism, torchtitan's default policy)."""
    return (b.pp == 1) | job.framework_record.reshards_under_pipeline


def col(x):
    """An (N,) array as an (N, 1) column, to broadcast over the stage axis."""
    return np.asarray(x)[:, None]


@cached
def stage_layer_counts(model: ModelSpec, b: StrategyBatch):
    """(dense, moe) layer counts per stage, (N, P) arrays; layer j is MoE when (j+1) % freq == 0."""
    layers = b.stage_layers.astype(np.int64)
    if model.moe is None:
        return layers, np.zeros_like(layers)
    start = np.cumsum(layers, axis=1) - layers if b.stage_start_layer is None else b.stage_start_layer
    moe = model.moe_layers_before(start + layers) - model.moe_layers_before(start)
    return layers - moe, moe


def stage_columns(b: StrategyBatch) -> np.ndarray:
    """Each column's stage index, (N, P) (or (1, P) when column i is stage i)."""
    if b.stage_index is not None:
        return b.stage_index
    return np.arange(b.stage_layers.shape[1])[None, :]


@cached
def stage_masks(b: StrategyBatch):
    """(active, first, last) boolean (N, P) masks over the padded stage axis."""
    cols = stage_columns(b)
    pp = b.pp[:, None]
    return cols < pp, cols == 0, cols == pp - 1


@cached
def in_flight(b: StrategyBatch):
    """Micro-batches' worth of activations held at the peak on each stage, (N, P) float array."""
    cols = stage_columns(b).astype(float)
    p = b.pp[:, None].astype(float)
    m = b.num_micro_batches[:, None].astype(float)
    v = b.virtual_pipeline_stages[:, None].astype(float)
    sched = b.pipeline_schedule[:, None]
    one_f = np.minimum(p - cols, m)
    # Interleaved: warm-up chunks of L/(pv) layers each, expressed in whole-stage micro-batches.
    chunks = np.minimum((p - cols - 1) * 2 + (v - 1) * p + 1, m * v)
    inter = chunks / v
    return np.select([sched == GPIPE, sched == INTERLEAVED], [np.broadcast_to(m, one_f.shape), inter], one_f)


@cached
def peak_stages(model: ModelSpec, b: StrategyBatch) -> StrategyBatch:
    """The batch cut to the stages that can hold each candidate's memory peak (stage_index says which).

    A stage's memory depends on where it sits in the pipeline only through the micro-batches it holds in
    flight, which never grow down the pipeline (in_flight), and it is affine in them (swapped layers
    included: advisor.cost.swap); everything else follows from the stage's layer counts, its recomputed
    and swapped layers and whether it is the first or last. So within a run of consecutive stages alike in
    all of those, both the peak and the first stage reaching it lie at one end of the run: the runs' ends
    are all memory() needs to find the worst stage (a 64-stage pipeline of equal stages has four)."""
    if b.stage_index is not None:
        return b
    dense_n, moe_n = stage_layer_counts(model, b)
    active, first, last = stage_masks(b)
    same = active[:, 1:] & ~first[:, :-1] & ~last[:, 1:]       # column c + 1 continues column c's run
    for part in (dense_n, moe_n, b.recompute_layers, b.swap_layers):
        same &= part[:, 1:] == part[:, :-1]
    ends = np.ones(active.shape, dtype=bool)
    ends[:, 1:] &= ~same            # a run's first column
    ends[:, :-1] |= ~same           # ... or its last
    ends &= active
    counts = ends.sum(axis=1)
    width = int(counts.max(initial=1))
    if width >= active.shape[1]:
        return b
    rows, cols = np.nonzero(ends)                      # row by row, each row's kept columns in order
    at = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)     # their places in the row

    def gather(x, pad):
        out = np.broadcast_to(pad, (len(b), width)).copy()
        out[rows, at] = x[rows, cols]
        return out

    start = np.cumsum(b.stage_layers, axis=1) - b.stage_layers
    index = np.broadcast_to(stage_columns(b), ends.shape)
    return replace(b, stage_layers=gather(b.stage_layers, 0), recompute_layers=gather(b.recompute_layers, -1),
                   swap_layers=gather(b.swap_layers, 0), stage_index=gather(index, col(b.pp)),
                   stage_start_layer=gather(start, 0))


@cached
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
        expert = moe_layers * (model.moe.num_experts / ep) * model.expert_params / col(b.expert_tp)
    vocab = model.vocab_size * model.hidden_size / t
    pos = model.embedding_params - model.vocab_size * model.hidden_size
    # the word-embedding table on the host (advisor.cost.host_embedding) leaves the first stage
    embed = np.where(first, np.where(col(b.host_embedding), 0.0, vocab) + pos, 0.0)
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
    stage_total: np.ndarray | None = None      # (N, P): every stage's total (-1 where a stage is inactive); None
                                               # from memory(every_stage=False), as stage_parts
    host_activations: np.ndarray | None = None  # (N,): activations swapped to the host per device (advisor.cost.swap)
    host_params: np.ndarray | None = None       # (N,): offloaded weight and gradient shards per device
    host_embedding: np.ndarray | None = None    # (N,): the word-embedding slice on the host (cost.host_embedding)
    # (N, P) per stage: parameters, gradients, optimizer, activations per micro-batch, and the optimizer states,
    # activations and weight and gradient shards on the host, of one device of each stage (meaningful on
    # active stages; advisor execute compares every rank with its own stage's)
    stage_parts: dict[str, np.ndarray] | None = None

    @property
    def host_total(self) -> np.ndarray:
        """(N,): host memory per device: offloaded optimizer states, weights and gradients, swapped
        activations, a host embedding table."""
        out = self.host_optimizer
        for extra in (self.host_activations, self.host_params, self.host_embedding):
            if extra is not None:
                out = out + extra
        return out


def state_bytes_per_param(job: TrainingJob):
    """(weights, gradients, optimizer) bytes per parameter (ZeRO section 3.1; Megatron-Core's FP32
    gradient buffer, see the module docstring)."""
    adam = job.optimizer in ("adam", "adamw")
    if not job.mixed_precision:
        return 4.0, 4.0, (8.0 if adam else 4.0)
    optimizer = 12.0 if adam else 8.0  # fp32 master (+ moments)
    if job.framework_record.grad_buffer_in_reduce_dtype:
        # the gradient buffer is kept in the reduction dtype (main_grad; fp32 for bf16 by default)
        return 2.0, job.grad_reduce_bytes, optimizer
    return float(job.dtype_bytes), float(job.dtype_bytes), optimizer


def linear_params(model: ModelSpec, b: StrategyBatch):
    """(dense, expert) parameters of the linear layers (the FP8 GEMMs' weights; not the router, which
    Megatron-Core runs as a plain higher-precision linear) one device holds on each stage, (N, P)
    arrays; the expert part is sharded over the expert-data-parallel group under ZeRO."""
    t = b.tp[:, None].astype(float)
    dense_layers, moe_layers = stage_layer_counts(model, b)
    attn = model.attention_matmul_params()
    dense = dense_layers * (attn + model.ffn_matrices * model.hidden_size * model.ffn_hidden_size) / t
    expert = np.zeros_like(dense)
    if model.moe is not None:
        local_experts = model.moe.num_experts / b.ep[:, None]
        expert = (moe_layers * local_experts * model.ffn_matrices * model.hidden_size * model.moe.expert_ffn_hidden_size
                  / col(b.expert_tp))
        dense = dense + moe_layers * (attn + model.ffn_matrices * model.hidden_size * model.moe.shared_ffn) / t
    return dense, expert


def largest_local_layer(model: ModelSpec, b: StrategyBatch) -> np.ndarray:
    """Parameters of the largest layer one device holds (its tensor-parallel shard and, in an MoE
    layer, its ep-th of the experts), (N, 1): what ZeRO-3 gathers and reduces per unit."""
    t = b.tp[:, None].astype(float)
    dense = np.full_like(t, model.dense_layer_params)
    if model.moe is None:
        return dense / t
    experts = model.moe.num_experts * model.expert_params
    moe = (model.moe_layer_params - experts) / t + experts / b.ep[:, None] / col(b.expert_tp)
    return np.maximum(dense / t, moe)


def _layer_activations(model: ModelSpec, job: TrainingJob, b: StrategyBatch, dense_n, moe_n):
    """(per micro-batch bytes of each stage's layers, the replay peak of one recomputed layer), (N, P).

    Recomputing only ``recompute_layers`` layers of a stage keeps the rest whole (Megatron's
    --recompute-method block; MindFormers' per-stage lists); a recomputed layer's dropped tensors are
    live again during its backward, in place of what it kept, once the later layers are freed. With
    layers of two sizes (MoE and dense), the layers kept whole are taken to be the larger ones: a
    bound that does not depend on where the recomputed block falls."""
    gated = model.ffn_activation == "swiglu"
    dense_terms = layer_activation_terms(model, job, b, moe_layer=False)
    d_keep = col(kept_bytes(dense_terms, b.recompute, job, gated))
    if model.moe is None:     # no MoE layer on any stage (moe_n is 0): the MoE terms are never read
        moe_terms, m_keep = dense_terms, d_keep
    else:
        moe_terms = layer_activation_terms(model, job, b, moe_layer=True)
        m_keep = col(kept_bytes(moe_terms, b.recompute, job, gated, moe_layer=True))
    d_full = col(dense_terms.no_recompute)
    m_full = col(moe_terms.no_recompute)
    n_layers = dense_n + moe_n
    recomputing = col(b.recompute) != RECOMPUTE_NONE
    limit = np.where(b.recompute_layers < 0, n_layers, np.minimum(b.recompute_layers, n_layers))
    whole = np.where(recomputing, n_layers - limit, n_layers)
    moe_whole = np.where(m_full >= d_full, np.minimum(whole, moe_n), np.maximum(whole - dense_n, 0))
    dense_whole = whole - moe_whole
    moe_rc, dense_rc = moe_n - moe_whole, dense_n - dense_whole
    per_mb = moe_whole * m_full + dense_whole * d_full + moe_rc * m_keep + dense_rc * d_keep
    one_full = np.where(moe_rc > 0, m_full, d_full)
    one_kept = np.where(moe_rc > 0, m_keep, d_keep)
    not_recomputed = moe_whole * m_full + dense_whole * d_full
    replay = np.where(recomputing & (moe_rc + dense_rc > 0), np.maximum(one_full - one_kept - not_recomputed, 0.0), 0.0)
    return per_mb, replay


def swapped_layer_bytes(model: ModelSpec, job: TrainingJob, b: StrategyBatch):
    """(N, P): one average layer's full activations per micro-batch on each stage (what a swapped
    layer sends to the host)."""
    dense_n, moe_n = stage_layer_counts(model, b)
    dense = col(layer_activation_terms(model, job, b, moe_layer=False).no_recompute)
    moe = col(layer_activation_terms(model, job, b, moe_layer=True).no_recompute)
    return swap.layer_bytes(dense_n, moe_n, dense, moe)


def memory(model: ModelSpec, job: TrainingJob, b: StrategyBatch, every_stage: bool = True) -> MemoryArrays:
    """Each candidate's memory on its worst stage. ``every_stage`` False: only the worst stage's figures are
    needed (the search's), and they are computed over the stages that can hold the peak (peak_stages);
    stage_total and stage_parts are then None."""
    if not every_stage:
        fewer = peak_stages(model, b)
        m = memory(model, job, fewer)
        worst = m.worst_stage if fewer.stage_index is None else fewer.stage_index[np.arange(len(b)), m.worst_stage]
        return replace(m, worst_stage=worst, stage_total=None, stage_parts=None)
    dense, expert = stage_params(model, b)
    dp_group = (b.dp * b.cp)[:, None].astype(float)
    # the experts' data-parallel group: tp x dp x cp ranks over ep x the experts' own tp (dp x cp / ep unfolded)
    ep_group = np.maximum(dp_group * col(b.tp) / (b.ep[:, None] * col(b.expert_tp)), 1.0)
    z = b.zero_stage[:, None]
    wb, gb, ob = state_bytes_per_param(job)

    dense_shard, expert_shard = dense / dp_group, expert / ep_group

    def sharded(bytes_per, from_stage):
        on = z >= from_stage
        return bytes_per * (np.where(on, dense_shard, dense) + np.where(on, expert_shard, expert))

    params = sharded(wb, 3)
    grads = sharded(gb, 2)
    optim_all = sharded(ob, 1)
    offload = b.offload_optimizer[:, None]
    host_share = np.where(offload, b.offload_fraction[:, None], 0.0)     # on the host: all, or a fraction
    optim = (1.0 - host_share) * optim_all

    dense_n, moe_n = stage_layer_counts(model, b)
    per_mb, replay = _layer_activations(model, job, b, dense_n, moe_n)
    first_x, last_x = end_stage_activations(model, job, b)
    active, first, last = stage_masks(b)
    per_mb = per_mb + np.where(first, col(first_x), 0.0) + np.where(last, col(last_x), 0.0)
    # the last stage's fp32 logits gradient is live once, during its backward (not per micro-batch in flight)
    acts = per_mb * in_flight(b) + replay + np.where(last, col(logits_gradient_bytes(model, job, b)), 0.0)
    host_stage_acts, host_acts = np.zeros(1), np.zeros(len(b))
    if b.swap_layers.any():       # activations swapped to the host (advisor.cost.swap)
        per_layer = swapped_layer_bytes(model, job, b)
        acts = acts - swap.saved_bytes(b, per_layer, in_flight(b))
        host_stage_acts = b.swap_layers * per_layer * in_flight(b)
        host_acts = np.max(host_stage_acts, axis=1)

    n_layers = dense_n + moe_n
    layer_local = largest_local_layer(model, b)
    # FP8: the cached FP8 weights of the linear layers one device holds (under ZeRO-3 only the
    # gathered units': they are cast as they are gathered)
    copy_bytes = fp8.weight_copy_bytes_per_param(job)
    fp8_weights = job.fp8_param_gather or copy_bytes > 0.0
    dense_linear, expert_linear = linear_params(model, b) if fp8_weights else (0.0, 0.0)
    linear = dense_linear + expert_linear
    if job.fp8_param_gather:
        # FP8 primary weights: the linear layers' weights take 1 byte instead of wb, and only the
        # transposed (column-wise) FP8 copy is cached beside them
        params = params - (wb - 1.0) * np.where(z >= 3, dense_linear / dp_group + expert_linear / ep_group, linear)
        copy_bytes = fp8.WEIGHT_COPY_BYTES[job.recipe] - 1.0
    fp8_copies = (copy_bytes * np.where(z >= 3, np.minimum(2.0 * linear / np.maximum(n_layers, 1), linear), linear)
                  if fp8_weights else 0.0)
    # ZeRO-2/3 hold the gradients of the unit being reduced unsharded, in the reduction dtype: at most
    # the gradients that sharding saves (a unit is never more than the whole stage)
    unit_grads = np.minimum(layer_local * job.grad_reduce_bytes, gb * (dense + expert) - grads)
    buffers = (
        # ZeRO-3 gathers the current and the prefetched unit's weights
        np.where((z >= 3) & (dp_group > 1), 2.0 * layer_local * wb, 0.0)
        + np.where((z >= 2) & (dp_group > 1), unit_grads, 0.0)
        + np.where(dp_group > 1, col(fusion.buffer_bytes(b, DDP_BUCKET_BYTES)), 0.0)
        + np.where(col(b.sequence_parallel), 2.0 * job.seq_length / col(b.cp) * col(b.micro_batch_size) * model.hidden_size * job.dtype_bytes / 2.0, 0.0)
        + np.where(active, fp8_copies, 0.0)
        + np.where(active, col(dataset.device_bytes(job, b)), 0.0)       # the input pipeline's samples
    )
    # FSDP2 under pipelining: the whole stage's weights stay gathered and its gradients accumulate
    # unsharded for the step, in place of the per-unit gather and reduction buffers
    kept = (z >= 3) & (dp_group > 1) & col(~resharding(job, b))
    unsharded_w = wb * (dense + expert) - ((wb - 1.0) * linear if job.fp8_param_gather else 0.0)
    unsharded = unsharded_w + job.grad_reduce_bytes * (dense + expert)
    buffers = np.where(kept, buffers - 2.0 * layer_local * wb - unit_grads + unsharded, buffers)
    # parameter offload: the weight and gradient shards live in host memory (only the gathered units stay)
    offload_p = b.offload_params[:, None]
    host_stage_params = np.where(offload_p, params + grads, 0.0)
    host_params = np.max(host_stage_params, axis=1)
    params, grads = np.where(offload_p, 0.0, params), np.where(offload_p, 0.0, grads)
    # without ZeRO-3's gather buffers (one replica: nothing to gather), the layer being fetched, the
    # prefetched one and the gradients on their way out still take device memory
    fetched = offload_p & ~((z >= 3) & (dp_group > 1))
    buffers = buffers + np.where(fetched, 2.0 * layer_local * wb + layer_local * job.grad_reduce_bytes, 0.0)
    subtotal = params + grads + optim + acts
    buffers = buffers + ALLOCATOR_OVERHEAD * subtotal
    total = np.where(active, subtotal + buffers, -1.0)
    worst = np.argmax(total, axis=1)
    rows = np.arange(total.shape[0])

    def pick(x):
        return np.broadcast_to(x, total.shape)[rows, worst]

    return MemoryArrays(
        parameters=pick(params), gradients=pick(grads), optimizer=pick(optim), activations=pick(acts),
        buffers=pick(buffers), total=pick(total), host_optimizer=np.max(host_share * optim_all, axis=1),
        worst_stage=worst, activation_per_microbatch=pick(per_mb), stage_total=total, host_activations=host_acts,
        host_params=host_params,
        stage_parts={name: np.broadcast_to(x, total.shape) for name, x in (
            ("parameters", params), ("gradients", grads), ("optimizer", optim), ("activations_per_microbatch", per_mb),
            ("host_optimizer", host_share * optim_all), ("host_activations", host_stage_acts),
            ("host_params", host_stage_params))},
    )
