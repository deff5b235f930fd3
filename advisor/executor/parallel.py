"""Apply a plan's parallelism to the model with PyTorch's own distributed stack.

* Device mesh: ``init_device_mesh`` with the plan's mesh order (outermost first; the last dimension
  gets consecutive ranks).
* Tensor parallelism: ``parallelize_module`` with ColwiseParallel / RowwiseParallel (Megatron's
  column/row split of attention and MLP), the token embedding RowwiseParallel and the LM head
  ColwiseParallel; with sequence parallelism the norms (and learned positions) are SequenceParallel
  and the attention/MLP inputs are all-gathered by PrepareModuleInput (Korthikanti et al. 2022).
* Recomputation: non-reentrant ``checkpoint_wrapper`` around each block (full; the first
  ``recompute_layers`` blocks of a stage when given) or around the attention core (selective).
* Data parallelism: ZeRO-3 = FSDP2 ``fully_shard`` with ``reshard_after_forward=True``; ZeRO-2 =
  ``fully_shard`` with ``reshard_after_forward=False`` (parameters stay gathered from forward to
  backward; gradients and optimizer state sharded); ZeRO-0 = gradients all-reduced over the
  data-parallel group after accumulation through one persistent buffer (Megatron-style DDP,
  :class:`GradientAverager`); ZeRO-1 = :class:`ZeroOneOptimizer` (Megatron's distributed
  optimizer): gradients reduce-scattered, the optimizer state partitioned element-wise over the
  data-parallel ranks, updated parameters all-gathered. (torch's ``replicate`` turns TP DTensor
  parameters into non-leaf tensors in 2.13, and ``ZeroRedundancyOptimizer`` partitions whole
  parameters and rejects DTensors, hence the two small pieces here.)
* Pipeline parallelism: ``torch.distributed.pipelining`` PipelineStage per model chunk and the
  plan's schedule (GPipe, 1F1B, Interleaved1F1B; zero-bubble ones for hand-written plans). Stage s
  holds chunks s, s + pp, ... (looped), or s and 2pp - 1 - s for the V schedules; the layers of
  physical stage s are ``stage_layers[s]``, split evenly over its chunks in Megatron's order.
* Tied embeddings across pipeline ends: the LM head holds a copy of the embedding weight whose
  gradient is summed with the embedding's after backward (Megatron's embedding group).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from advisor.executor.config import MESH_DIMS, RunConfig, V_SCHEDULES
from advisor.executor.model import GPT


# ---- mesh --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Coords:
    """This rank's place in the mesh."""

    pp: int
    dp: int
    tp: int
    cp: int = 0


def build_mesh(cfg: RunConfig, device_type: str):
    from torch.distributed.device_mesh import init_device_mesh

    p = cfg.parallel
    names = tuple(p.mesh_order)
    shape = tuple(getattr(p, d) for d in names)
    layout = cfg.operator_layout
    if layout is not None and len(layout.mesh_shape) > 1:
        # an operator layout's group mesh: tp as axes tp0, tp1, ... (outermost first), flattened back to "tp"
        at = names.index("tp")
        axes = tuple(f"tp{i}" for i in range(len(layout.mesh_shape)))
        mesh = init_device_mesh(device_type, shape[:at] + tuple(layout.mesh_shape) + shape[at + 1:],
                                mesh_dim_names=names[:at] + axes + names[at + 1:])
        mesh[axes]._flatten("tp")
    else:
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    where = {d: mesh[d].get_local_rank() for d in MESH_DIMS}
    return mesh, Coords(pp=where["pp"], dp=where["dp"], tp=where["tp"], cp=where["cp"])


def replica_mesh(mesh, cfg: RunConfig):
    """The mesh the data-parallel reduction and ZeRO sharding run over: dp, or dp x cp flattened when
    the sequence is split (context-parallel ranks hold the same weights and reduce their gradients
    together: Megatron-Core's data-parallel group with cp, torchtitan's dp_shard_cp)."""
    if cfg.parallel.cp == 1:
        return mesh["dp"]
    names = tuple(d for d in mesh.mesh_dim_names if d in ("dp", "cp"))
    return mesh[names]._flatten("dp_cp")


# ---- layer placement ---------------------------------------------------------------------------
def chunk_layout(cfg: RunConfig) -> list[tuple[int, int, tuple[int, ...]]]:
    """(virtual stage index, physical stage, layer ids) for every model chunk, in model order."""
    p = cfg.parallel
    v = p.virtual_pipeline_stages
    per_chunk = [n // v for n in p.stage_layers]
    n_stages = p.pp * v
    owner = [stage_to_rank(i, p.pp, n_stages, p.pipeline_schedule) for i in range(n_stages)]
    taken = [0] * p.pp
    out, next_layer = [], 0
    for stage in range(n_stages):
        rank = owner[stage]
        count = per_chunk[rank]
        out.append((stage, rank, tuple(range(next_layer, next_layer + count))))
        taken[rank] += count
        next_layer += count
    return out


def stage_to_rank(stage: int, pp: int, n_stages: int, schedule: str) -> int:
    if schedule in V_SCHEDULES:
        return stage if stage < pp else n_stages - 1 - stage
    return stage % pp


def build_chunks(cfg: RunConfig, pp_rank: int) -> list[tuple[int, GPT]]:
    """This rank's model chunks (virtual stage index, module), fully initialized."""
    layout = chunk_layout(cfg)
    last = len(layout) - 1
    chunks = []
    for stage, rank, layers in layout:
        if rank == pp_rank:
            chunks.append((stage, GPT(cfg.model, layers, has_embedding=stage == 0, has_head=stage == last,
                                      init_seed=cfg.seed)))
    return chunks


def apply_multi_copy(model: GPT, copies: int) -> None:
    """Multi-copy parallelism: every block cuts its micro-batch into ``copies`` interleaved copies (Block)."""
    for block in model.layers.values():
        block.copies = copies


# ---- tensor / sequence parallel ----------------------------------------------------------------
def apply_tensor_parallel(model: GPT, tp_mesh, sequence_parallel: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()
    for block in model.layers.values():
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel(output_layouts=act)}
        if block.mlp.swiglu:
            plan.update({"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
                         "mlp.down": RowwiseParallel(output_layouts=act)})
        else:
            plan.update({"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=act)})
        if sp:
            gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)
            plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(),
                         "attn": PrepareModuleInput(**gather), "mlp": PrepareModuleInput(**gather)})
        parallelize_module(block, tp_mesh, plan)
    top = {}
    if model.embed is not None:
        top["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
        if model.embed.pos is not None and sp:
            top["embed.pos"] = SequenceParallel(use_local_output=True)
    if model.head is not None:
        # logits stay split over the vocabulary: the loss is vocab-parallel (model.VocabParallelLoss)
        top["head"] = ColwiseParallel(input_layouts=act, output_layouts=Shard(-1))
        if sp:
            top["norm"] = SequenceParallel()
    if top:
        parallelize_module(model, tp_mesh, top)
    if model.head is not None and model.embed is not None and model.cfg.tie_embeddings:
        model.head.weight = model.embed.tok.weight   # re-tie: both are Shard(0) over the vocabulary
    if model.embed is not None:
        model.embed.tok.weight.register_post_accumulate_grad_hook(_keep_grad_sharded)


def _keep_grad_sharded(param) -> None:
    """torch computes a RowwiseParallel embedding's gradient as a replicated (full) tensor; keep it in
    the parameter's vocabulary sharding, as Megatron's VocabParallelEmbedding does (a local slice)."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


# ---- recomputation -----------------------------------------------------------------------------
def apply_recompute(model: GPT, recompute: str, recompute_layers: int | None) -> list[nn.Module]:
    """Wrap blocks (full) or attention cores (selective); returns the wrappers (their inputs are the
    activations a checkpoint keeps)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrappers = []
    if recompute == "none":
        return wrappers
    for i, key in enumerate(list(model.layers.keys())):
        block = model.layers[key]
        if recompute == "full":
            if recompute_layers is not None and i >= recompute_layers:
                continue
            wrapped = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            model.layers[key] = wrapped
        elif block.attn.core.flash:   # a fused (flash) core keeps no scores: nothing to recompute
            continue
        else:
            wrapped = checkpoint_wrapper(block.attn.core, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            block.attn.core = wrapped
        wrappers.append(wrapped)
    return wrappers


# ---- data parallel -----------------------------------------------------------------------------
def apply_fsdp(model: GPT, dp_mesh, reshard_after_forward: bool, reduce_dtype: torch.dtype | None = None,
               offload: bool = False) -> None:
    """FSDP2 groups as torchtitan: one per block, the embedding, the final norm with the head, root.
    A tied embedding and head on one chunk share the root group. ``reduce_dtype``: the gradients'
    reduce-scatter dtype (MixedPrecisionPolicy.reduce_dtype; the reduced shard is cast back to the
    parameters' dtype). ``offload``: parameter offload (ZeRO-Infinity's offload_param; FSDP2's
    CPUOffloadPolicy): the parameter shards and their gradients live in host memory, each unit copied
    to the device for its forward and backward, and the optimizer steps them there."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw = dict(mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    if reduce_dtype is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=dp_mesh.device_type == "cuda")
    for block in model.layers.values():
        fully_shard(block, **kw)
    tied_here = model.cfg.tie_embeddings and model.embed is not None and model.head is not None
    if not tied_here:
        if model.embed is not None:
            fully_shard(model.embed, **kw)
        if model.head is not None:
            fully_shard([model.norm, model.head], **kw)
    fully_shard(model, **kw)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def resolve_partial_gradients(params: list[nn.Parameter]) -> None:
    """Sum pending partial gradients over their mesh (the sequence-parallel norms' gradients are
    Partial over tp until then), so their local tensors are the true gradients. The DTensor
    optimizer does this implicitly; ZeRO-1's slicing of local tensors needs it done first."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])


class GradientAverager:
    """ZeRO-0 data parallelism: local gradients averaged over the data-parallel group through one
    persistent flat buffer (DDP's gradient buckets, Megatron's contiguous gradient buffer): a
    buffer allocated once is reused every step, as in those systems, rather than paged in anew.
    With ``reduce_dtype`` (mixed precision) the buffer is in that dtype and the average is rounded
    back into the compute-dtype gradients, as FSDP2's reduce_dtype does (the pytorch record: 2-byte
    gradients, reduced at 4 bytes)."""

    def __init__(self, params: list[nn.Parameter], group, world: int, bucket_mb: float | None = None,
                 reduce_dtype: torch.dtype | None = None):
        self.params, self.group, self.world = params, group, world
        self.reduce_dtype = reduce_dtype     # None: the gradients' own dtype
        self.flat: torch.Tensor | None = None
        # with a bucket size (the plan's grad_bucket_mb): one all-reduce per bucket-sized slice of the
        # buffer, as DDP's bucket_cap_mb and Megatron's bucket_size issue them; otherwise one for all
        self.bucket_bytes = None if bucket_mb is None else bucket_mb * 2 ** 20
        self.collectives_per_step = 0

    def __call__(self) -> None:
        grads = [_local(p.grad) for p in self.params if p.grad is not None]
        if not grads:
            return
        total = sum(g.numel() for g in grads)
        dtype = self.reduce_dtype or grads[0].dtype
        if self.flat is None or self.flat.numel() != total or self.flat.dtype != dtype:
            self.flat = torch.empty(total, dtype=dtype, device=grads[0].device)
        _flatten_into(self.flat, grads)
        step = total if self.bucket_bytes is None else max(1, int(self.bucket_bytes // self.flat.element_size()))
        self.collectives_per_step = 0
        for start in range(0, total, step):
            dist.all_reduce(self.flat[start: start + step], group=self.group)
            self.collectives_per_step += 1
        self.flat.div_(self.world)
        offset = 0
        for g in grads:
            g.copy_(self.flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()


def _flatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy tensors one after another into the front of ``flat`` (casting to its dtype)."""
    if all(t.dtype == flat.dtype for t in tensors):
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:sum(t.numel() for t in tensors)])
        return
    offset = 0
    for t in tensors:
        flat[offset: offset + t.numel()].copy_(t.reshape(-1))
        offset += t.numel()


class ZeroOneOptimizer:
    """ZeRO stage 1 (Rajbhandari et al. 2020): each data-parallel rank keeps optimizer state for a
    contiguous 1/dp slice of the (local, TP-sharded) parameters: the gradients are reduce-scattered
    so that it receives the averaged gradient of that slice, it steps the slice, and the updated
    slices are all-gathered. The inner optimizer is torch's, on parameter views, so the update is
    element-for-element the one a replicated optimizer makes."""

    def __init__(self, params: list[nn.Parameter], make_optimizer, group, dp: int, dp_rank: int,
                 reduce_dtype: torch.dtype | None = None):
        self.params = [p for p in params]
        self.group, self.dp, self.rank = group, dp, dp_rank
        total = sum(_local(p).numel() for p in self.params)
        self.shard = -(-total // dp)
        lo, hi = dp_rank * self.shard, min((dp_rank + 1) * self.shard, total)
        self.views: list[tuple[nn.Parameter, nn.Parameter, int, int]] = []
        self._offsets: dict[int, int] = {}
        offset = 0
        for p in self.params:
            self._offsets[id(p)] = offset
            n = _local(p).numel()
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                view = nn.Parameter(_local(p).detach().view(-1)[a - offset: b - offset])
                self.views.append((p, view, a - offset, b - offset))
            offset += n
        self.total = total
        self.inner = make_optimizer([v for _, v, _, _ in self.views]) if self.views else None
        # persistent communication buffers (the distributed optimizer's contiguous buffers): the
        # parameters' all-gather in their dtype, the gradients' reduce-scatter in reduce_dtype
        ref = _local(self.params[0])
        self.flat = torch.zeros(self.shard * dp, dtype=ref.dtype, device=ref.device)
        self.mine = torch.zeros(self.shard, dtype=ref.dtype, device=ref.device)
        if reduce_dtype is None or reduce_dtype == ref.dtype:
            self.grad_flat, self.grad_mine = self.flat, self.mine
        else:
            self.grad_flat = torch.zeros(self.shard * dp, dtype=reduce_dtype, device=ref.device)
            self.grad_mine = torch.zeros(self.shard, dtype=reduce_dtype, device=ref.device)

    def reduce_gradients(self) -> None:
        """Reduce-scatter the flat gradient (Megatron's distributed optimizer): each rank receives
        the data-parallel average of the slice it owns, written back into its gradients' slices;
        the rest of its gradients stay local partial sums and are not read."""
        flat, mine = self.grad_flat, self.grad_mine
        grads = [_local(p.grad).reshape(-1) if p.grad is not None else torch.zeros_like(_local(p)).reshape(-1)
                 for p in self.params]
        _flatten_into(flat, grads)
        dist.reduce_scatter_tensor(mine, flat, group=self.group)
        mine.div_(self.dp)
        lo = self.rank * self.shard
        for p, _, a, b in self.views:
            if p.grad is not None:
                start = self._offsets[id(p)] - lo
                _local(p.grad).view(-1)[a:b].copy_(mine[start + a: start + b])

    def owned_slices(self) -> list[tuple[nn.Parameter, int, int]]:
        """(parameter, start, end) of the flat local elements this rank owns."""
        return [(p, a, b) for p, _, a, b in self.views]

    def step(self) -> None:
        for p, view, a, b in self.views:
            view.grad = _local(p.grad).view(-1)[a:b] if p.grad is not None else None
        if self.inner is not None:
            self.inner.step()
        self._all_gather()

    def _all_gather(self) -> None:
        locals_ = [_local(p).detach().view(-1) for p in self.params]
        mine, full = self.mine, self.flat
        owned = [view.detach() for _, view, _, _ in self.views]   # the updated slices, in flat order
        if owned:
            torch.cat(owned, out=mine[:sum(t.numel() for t in owned)])
        dist.all_gather_into_tensor(full, mine, group=self.group)
        with torch.no_grad():
            torch._foreach_copy_(locals_, list(torch.split(full[:self.total], [t.numel() for t in locals_])))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        for _, v, _, _ in self.views:
            v.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        return optimizer_state_tensors(self.inner) if self.inner is not None else []


class MasterWeightOptimizer:
    """Mixed-precision training's optimizer (Micikevicius et al. 2018; Megatron-LM's
    Float16OptimizerWithFloat16Params, DeepSpeed's bf16 optimizer): an fp32 master copy of each
    (local) parameter, which torch's optimizer steps with the gradient upcast to fp32; the result
    is rounded back into the compute-dtype weights. Model states: 2 + 2 + 12 bytes per parameter
    in bf16 (ZeRO section 3.1's K = 12: master, momentum, variance).

    Optimizer offload (ZeRO-Offload, Ren et al. 2021; Megatron-Core's HybridDeviceOptimizer): the
    first ``host_fraction`` of the local elements, in parameter order, keep their masters and moments
    in host memory and are stepped there by torch's optimizer on the CPU (gradients copied to the
    host, updated weights copied back); the rest stay on the device. Megatron's
    --optimizer-offload-fraction and DeepSpeed's offload_optimizer.ratio: the split falls inside a
    tensor where it must (the update is element-wise, so where it falls changes no value)."""

    def __init__(self, params: list[nn.Parameter], make_optimizer, host_fraction: float = 0.0):
        self.params = list(params)
        total = sum(_local(p).numel() for p in self.params)
        boundary = round(host_fraction * total)
        # (parameter, start, end, master): the masters cover each local parameter's flat elements once
        self.pieces: list[tuple[nn.Parameter, int, int, nn.Parameter]] = []
        self.host: set[int] = set()           # ids of the masters kept in host memory
        offset = 0
        with torch.no_grad():
            for p in self.params:
                flat = _local(p).detach().reshape(-1)
                n = flat.numel()
                cuts = sorted({0, n, min(max(boundary - offset, 0), n)})
                for a, b in zip(cuts, cuts[1:]):
                    on_host = offset + a < boundary
                    where = torch.device("cpu") if on_host else None
                    m = nn.Parameter(flat[a:b].to(device=where, dtype=torch.float32, copy=True))
                    self.pieces.append((p, a, b, m))
                    if on_host:
                        self.host.add(id(m))
                offset += n
        self.masters = [m for _, _, _, m in self.pieces]
        self.inner = make_optimizer(self.masters)

    def step(self) -> None:
        for p, a, b, m in self.pieces:
            m.grad = (_local(p.grad).reshape(-1)[a:b].to(device=m.device, dtype=torch.float32)
                      if p.grad is not None else None)
        self.inner.step()
        with torch.no_grad():
            for p, a, b, m in self.pieces:
                m.grad = None    # the fp32 gradient copies live only during the step
                _local(p).view(-1)[a:b].copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        return list(self.masters) + optimizer_state_tensors(self.inner)

    def host_state_tensors(self) -> list[torch.Tensor]:
        """The masters and moments kept in host memory."""
        host = [m for m in self.masters if id(m) in self.host]
        out = list(host)
        for m in host:
            out += [v for v in self.inner.state.get(m, {}).values() if isinstance(v, torch.Tensor)]
        return out


class HostTableOptimizer:
    """The device's optimizer beside the host table's own (MindSpore's Host&Device training: the table's
    optimizer has target "CPU"): torch's, on the fp32 table, stepped after the device's."""

    def __init__(self, device, table, table_params: list[nn.Parameter]):
        self.device, self.table, self.table_params = device, table, list(table_params)

    def step(self) -> None:
        self.device.step()
        self.table.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.device.zero_grad(set_to_none=set_to_none)
        self.table.zero_grad(set_to_none=set_to_none)

    def table_tensors(self) -> list[torch.Tensor]:
        """What the host keeps of the table: its weights, their gradient and the optimizer's states."""
        grads = [p.grad for p in self.table_params if p.grad is not None]
        return self.table_params + grads + optimizer_state_tensors(self.table)


def with_host_table(build, optimizer: str, lr: float, params: list[nn.Parameter], table: list[nn.Parameter]):
    """``build``'s optimizer over ``params``, or with a host table (``table``) that optimizer over the
    others and torch's own over the table."""
    if not table:
        return build(params)
    ids = {id(p) for p in table}
    return HostTableOptimizer(build([p for p in params if id(p) not in ids]),
                              make_torch_optimizer(optimizer, lr)(table), table)


def optimizer_state_tensors(opt) -> list[torch.Tensor]:
    """Every tensor of optimizer state (fp32 masters included), wherever it is kept; a host table's are
    not (HostTableOptimizer.table_tensors)."""
    if isinstance(opt, HostTableOptimizer):
        return optimizer_state_tensors(opt.device)
    if isinstance(opt, (ZeroOneOptimizer, MasterWeightOptimizer)):
        return opt.state_tensors()
    out = []
    for state in opt.state.values():
        out += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def host_state_tensors(opt) -> list[torch.Tensor]:
    """The optimizer state kept in host memory (optimizer offload; none without it)."""
    if isinstance(opt, HostTableOptimizer):
        return host_state_tensors(opt.device)
    if isinstance(opt, ZeroOneOptimizer):
        return host_state_tensors(opt.inner) if opt.inner is not None else []
    return opt.host_state_tensors() if isinstance(opt, MasterWeightOptimizer) else []


def make_torch_optimizer(name: str, lr: float, master_weights: bool = False, host_fraction: float = 0.0):
    """torch's optimizer with its multi-tensor (foreach) kernels, one parameter group per kind of
    tensor (plain, or DTensor on one mesh): foreach ops cannot mix them. ``master_weights``: behind
    a MasterWeightOptimizer (mixed precision), ``host_fraction`` of its state on the host."""
    def build(params):
        if master_weights:
            return MasterWeightOptimizer(params, make_torch_optimizer(name, lr), host_fraction)
        groups = [{"params": g} for g in _homogeneous_groups(params)]
        if name == "sgd":
            return torch.optim.SGD(groups, lr=lr, momentum=0.9, foreach=True)
        if name == "adam":
            return torch.optim.Adam(groups, lr=lr, foreach=True)
        return torch.optim.AdamW(groups, lr=lr, weight_decay=0.01, foreach=True)
    return build


def _homogeneous_groups(params) -> list[list[nn.Parameter]]:
    from torch.distributed.tensor import DTensor

    groups: dict = {}
    for p in params:
        key = (id(p.device_mesh), tuple(map(str, p.placements))) if isinstance(p, DTensor) else "plain"
        groups.setdefault(key, []).append(p)
    return list(groups.values())
