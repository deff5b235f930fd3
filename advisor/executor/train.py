"""One training run: on every rank of a process group (``run_distributed``), or in one process
with no parallelism at all (``run_reference``, the yardstick for the losses)."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from advisor.executor.config import TORCH_DTYPES, RunConfig, mixed_precision, run_config_to_dict, torch_dtype
from advisor.executor.data import dp_slice, global_batch
from advisor.executor.measure import (ActivationTracker, ParameterProbe, gradient_bytes, parameter_bytes,
                                      tensor_bytes)
from advisor.executor.context_parallel import CPGroup
from advisor.executor.swap import LayerSwap, swapped_blocks
from advisor.executor.model import GPT, VocabParallelLoss, apply_context_parallel, apply_host_embedding, cross_entropy
from advisor.executor.operator_layout import LayoutLoss, apply_operator_layout, layout_mesh, stage_activation_shape
from advisor.executor.parallel import (GradientAverager, ZeroOneOptimizer, apply_fsdp, apply_multi_copy,
                                       apply_recompute, apply_tensor_parallel, build_chunks, build_mesh, chunk_layout,
                                       host_state_tensors, make_torch_optimizer, optimizer_state_tensors, replica_mesh,
                                       resolve_partial_gradients, with_host_table)


class InjectedFailure(RuntimeError):
    """Raised on purpose (RunConfig.inject_failure) to test failure handling."""


# ---- the single-process reference --------------------------------------------------------------
def run_reference(cfg: RunConfig) -> dict:
    """Same model, data, seed and optimizer as the parallel run, no parallelism: per-step loss and
    gradient norm. Runs on one intra-op thread (the deterministic, uncontended choice)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference(cfg)
    finally:
        torch.set_num_threads(threads)


def reference_key(cfg: RunConfig) -> str:
    """What the single-process reference depends on: plans whose keys are equal have the same reference.
    The layout does not enter it; the global batch, its micro-batch slicing (the order gradients are
    summed in) and a host table do, and everything else of the run (model, dtype, optimizer, steps, seed)."""
    d = run_config_to_dict(cfg)
    for name in ("name", "notes", "parallel"):
        d.pop(name)
    d["batch"] = [cfg.global_batch_size, cfg.parallel.micro_batch_size, cfg.parallel.host_embedding]
    return json.dumps(d, sort_keys=True, default=str)


def _reference(cfg: RunConfig) -> dict:
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model, range(cfg.model.num_layers), True, True, init_seed=cfg.seed).to(torch_dtype(cfg))
    table = apply_host_embedding(model) if cfg.parallel.host_embedding else []
    params = list(model.parameters())
    opt = with_host_table(make_torch_optimizer(cfg.optimizer, cfg.learning_rate, mixed_precision(cfg)),
                          cfg.optimizer, cfg.learning_rate, params, table)
    mbs = cfg.parallel.micro_batch_size
    losses, norms = [], []
    for step in range(cfg.steps):
        tokens = global_batch(step, cfg.global_batch_size, cfg.seq_length, cfg.model.vocab_size, cfg.seed)
        count = tokens.shape[0] // mbs
        total = 0.0
        for i in range(count):
            rows = tokens[i * mbs:(i + 1) * mbs]
            loss = cross_entropy(model(rows[:, :-1]), rows[:, 1:])
            (loss / count).backward()
            total += loss.item()
        losses.append(total / count)
        norms.append(float(sum(p.grad.double().pow(2).sum() for p in params if p.grad is not None)) ** 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": losses, "grad_norms": norms}


# ---- the distributed run -----------------------------------------------------------------------
class _Setup:
    """Everything one rank builds for a run."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        p = cfg.parallel
        self.cfg, self.device = cfg, device
        self.mixed = mixed_precision(cfg)
        # mixed precision reduces the data-parallel gradients in fp32 (the pytorch record's
        # bf16_grad_reduce_bytes; FSDP2's MixedPrecisionPolicy.reduce_dtype, DDP's fp32 buckets), or in
        # the plan's grad_reduce_dtype
        self.reduce_dtype = (getattr(torch, TORCH_DTYPES[cfg.grad_reduce_dtype or "fp32"]) if self.mixed else None)
        self.mesh, self.coords = build_mesh(cfg, device.type)
        # data-parallel and context-parallel ranks hold the same weights: gradients reduced, and
        # ZeRO shards kept, over dp x cp
        self.replicas = p.dp * p.cp
        self.replica_mesh = replica_mesh(self.mesh, cfg) if self.replicas > 1 else None
        self.ring = CPGroup(self.mesh["cp"].get_group(), p.cp, self.coords.cp, cfg.seq_length) if p.cp > 1 else None
        self.tracker = ActivationTracker()
        self.swap = LayerSwap(self.tracker)
        self.probe = ParameterProbe()
        self.chunks = build_chunks(cfg, self.coords.pp)
        self.n_stages = p.pp * p.virtual_pipeline_stages
        for stage, chunk in self.chunks:
            chunk.to(device=device, dtype=torch_dtype(cfg))
            if p.host_embedding:
                apply_host_embedding(chunk)
            apply_multi_copy(chunk, p.micro_batch_copies)
            if self.ring is not None:
                apply_context_parallel(chunk, self.ring, p.cp_comm)
            if cfg.operator_layout is not None:
                apply_operator_layout(chunk, layout_mesh(self.mesh, cfg.operator_layout), cfg.operator_layout,
                                      cfg.model.attention, cfg.model.position_embedding == "rotary")
            elif p.tp > 1:
                apply_tensor_parallel(chunk, self.mesh["tp"], p.sequence_parallel)
            for wrapper in apply_recompute(chunk, p.recompute, p.recompute_layers):
                self.tracker.watch_checkpoint(wrapper)
            if self.replicas > 1 and p.zero_stage >= 2:
                apply_fsdp(chunk, self.replica_mesh, reshard_after_forward=p.zero_stage == 3,
                           reduce_dtype=self.reduce_dtype, offload=p.offload_params)
            self.tracker.watch_chunk(f"chunk{stage}", chunk)
            if p.swap_layers is not None:      # one chunk per rank: its stage is this rank's pp coordinate
                for block in swapped_blocks(chunk, p.swap_layers[stage]):
                    self.swap.attach(block)
        self.modules = [c for _, c in self.chunks]
        if cfg.operator_layout is not None:
            self.loss_fn = LayoutLoss(layout_mesh(self.mesh, cfg.operator_layout), cfg.operator_layout)
        else:
            self.loss_fn = (VocabParallelLoss(self.mesh["tp"].get_group(), self.coords.tp, cfg.model.vocab_size, p.tp)
                            if p.tp > 1 else cross_entropy)
        self.probe.watch(self.modules)
        self.params = _unique_params(self.modules)
        # the host table's parameters, as the wrappers above left them (tensor parallelism makes them DTensors)
        self.table = ([c.embed.tok.weight for _, c in self.chunks if c.embed is not None]
                      if p.host_embedding else [])
        self.dp_group = self.replica_mesh.get_group() if self.replicas > 1 else None
        self.averager = (GradientAverager(self.params, self.dp_group, self.replicas, p.grad_bucket_mb,
                                          self.reduce_dtype)
                         if self.replicas > 1 and p.zero_stage == 0 else None)
        self.tied = _TiedEmbedding(cfg, self) if cfg.model.tie_embeddings and self.n_stages > 1 else None
        build = make_torch_optimizer(cfg.optimizer, cfg.learning_rate, self.mixed,
                                     p.offload_fraction if p.offload_optimizer else 0.0)
        if p.zero_stage == 1 and self.replicas > 1:
            self.optimizer = ZeroOneOptimizer(self.params, build, self.dp_group, self.replicas,
                                              self.replica_mesh.get_local_rank(), self.reduce_dtype)
        else:
            self.optimizer = with_host_table(build, cfg.optimizer, cfg.learning_rate, self.params, self.table)
        self.schedule = _schedule(cfg, self) if p.pp > 1 else None

    @property
    def holds_first(self) -> bool:
        return any(stage == 0 for stage, _ in self.chunks)

    @property
    def holds_last(self) -> bool:
        return any(stage == self.n_stages - 1 for stage, _ in self.chunks)


def _unique_params(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _schedule(cfg: RunConfig, s: _Setup):
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                              ScheduleZBVZeroBubble)

    p, m = cfg.parallel, cfg.model
    mbs = p.micro_batch_size
    seq_cp = cfg.seq_length // p.cp
    seq_local = seq_cp // p.tp if p.sequence_parallel else seq_cp
    # example tensors: static shapes (no shape-inference pass); requires_grad marks what flows back. Between
    # stages: the sequence-parallel shard, or an operator layout's shard (operator_layout.stage_activation_shape)
    dtype = torch_dtype(cfg)
    shape = ((mbs, seq_local, m.hidden_size) if cfg.operator_layout is None
             else stage_activation_shape(cfg.operator_layout, mbs, seq_cp, m.hidden_size))
    hidden = torch.zeros(shape, device=s.device, dtype=dtype, requires_grad=True)
    stages = []
    for stage, chunk in s.chunks:
        inp = torch.zeros(mbs, seq_cp, dtype=torch.long, device=s.device) if stage == 0 else hidden
        if stage == 0:
            # the schedule hands the first stage views of the step's whole token batch; a data loader hands
            # each micro-batch over in its own tensor (as _step does), else what the embedding saves for
            # backward would keep every micro-batch's tokens alive
            chunk.register_forward_pre_hook(_own_micro_batch)
        out = (torch.zeros(mbs, seq_cp, m.vocab_size // p.tp, device=s.device, dtype=dtype, requires_grad=True)
               if stage == s.n_stages - 1 else hidden)
        stages.append(PipelineStage(chunk, stage, s.n_stages, s.device, input_args=(inp,), output_args=(out,),
                                    group=s.mesh["pp"].get_group()))
    n = p.num_micro_batches
    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if p.pipeline_schedule in kinds:
        return kinds[p.pipeline_schedule](stages[0], n, loss_fn=s.loss_fn)
    multi = {"interleaved-1f1b": ScheduleInterleaved1F1B, "interleaved-zero-bubble": ScheduleInterleavedZeroBubble,
             "zbv-zero-bubble": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
    return multi[p.pipeline_schedule](stages, n, loss_fn=s.loss_fn)


def _own_micro_batch(module, args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


class _TiedEmbedding:
    """Megatron's embedding group: the first stage's embedding and the last stage's head copy get the
    sum of both gradients, so they stay equal."""

    def __init__(self, cfg: RunConfig, s: _Setup):
        self.local = []
        for stage, chunk in s.chunks:
            if chunk.embed is not None:
                self.local.append(chunk.embed.tok.weight)
            if chunk.head is not None:
                self.local.append(chunk.head.weight)
        self.group = None
        ranks_of = s.mesh.mesh  # tensor of global ranks, dims in mesh order
        names = list(s.mesh.mesh_dim_names)
        pp_dim = names.index("pp")
        first = 0
        last = [stage_rank for stage, stage_rank, _ in chunk_layout(cfg)][-1]
        if first == last:
            return
        moved = ranks_of.movedim(pp_dim, 0)
        pairs = torch.stack([moved[first], moved[last]], dim=-1).reshape(-1, 2)
        for pair in pairs.tolist():   # every rank creates every group, in the same order
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                self.group = group

    def sync(self) -> None:
        grads = [p.grad for p in self.local if p.grad is not None]
        if not grads:
            return
        from torch.distributed.tensor import DTensor

        local = [g._local_tensor if isinstance(g, DTensor) else g for g in grads]
        total = local[0].clone()
        for extra in local[1:]:
            total += extra
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for t in local:
            t.copy_(total)

    def is_copy(self, param: nn.Parameter, s: _Setup) -> bool:
        """The head copy (not counted twice in the gradient norm)."""
        return any(chunk.head is not None and chunk.head.weight is param and chunk.embed is None
                   for _, chunk in s.chunks)


def _owned_grad_sq(s: _Setup) -> float:
    """Sum of squares of the gradient elements this rank owns (each element counted once over the
    world): shards count where they live, replicas only at coordinate 0 of the replicating dims;
    under ZeRO-1 only the slices this rank owns hold reduced gradients, so they count for dp."""
    p = s.cfg.parallel
    coord = {"dp": s.coords.dp, "tp": s.coords.tp, "cp": s.coords.cp}
    sizes = {"dp": p.dp, "tp": p.tp, "cp": p.cp}
    zero1 = isinstance(s.optimizer, ZeroOneOptimizer)
    slices = s.optimizer.owned_slices() if zero1 else [(param, None, None) for param in s.params]
    total = 0.0
    for param, a, b in slices:
        if param.grad is None or (s.tied is not None and s.tied.is_copy(param, s)):
            continue
        local, sharded_on, covered, copy = _gradient_shard(param.grad)
        if zero1:
            sharded_on.update(("dp", "cp"))
        if copy or any(sizes[d] > 1 and d not in sharded_on and d not in covered and coord[d] != 0
                       for d in ("dp", "tp", "cp")):
            continue
        part = local.reshape(-1)[a:b] if zero1 else local
        total += float(part.double().pow(2).sum())
    return total


def _gradient_shard(g: torch.Tensor) -> tuple[torch.Tensor, set[str], set[str], bool]:
    """(this rank's local gradient, the mesh dims it is sharded on, the run's mesh dims its DTensor mesh
    covers, whether it is a copy: this rank is not the first of a mesh axis the gradient is replicated
    over), pending partial sums resolved. An operator layout's group axes tp0, tp1, ... cover tp."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    sharded_on: set[str] = set()
    covered: set[str] = set()
    if not isinstance(g, DTensor):
        return g, sharded_on, covered, False
    if any(pl.is_partial() for pl in g.placements):   # pending sums (sequence-parallel norms)
        g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
    names = g.device_mesh.mesh_dim_names or ()
    copy = False
    for name, placement, at in zip(names, g.placements, g.device_mesh.get_coordinate()):
        dims = {d.rstrip("0123456789") for d in name.split("_")}
        covered.update(dims)
        if isinstance(placement, Shard) or type(placement).__name__ == "_StridedShard":
            sharded_on.update(dims)
        elif at != 0:
            copy = True
    return g._local_tensor, sharded_on, covered, copy


def _step(s: _Setup, x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Forward and backward of one optimizer step; the mean loss of this rank's micro-batches (None
    on ranks without the last stage)."""
    p = s.cfg.parallel
    if s.schedule is not None:
        losses: list = []
        args = (x,) if s.holds_first else ()
        s.schedule.step(*args, target=y if s.holds_last else None, losses=losses)
        return float(torch.stack([x.detach() for x in losses]).mean()) if s.holds_last else None
    model = s.modules[0]
    n, mbs = p.num_micro_batches, p.micro_batch_size
    keep_gathered = p.zero_stage == 2 and s.replicas > 1
    total = 0.0
    for i in range(n):
        if keep_gathered:   # ZeRO-2: parameters stay whole through the step, gradients reduce-scattered each backward
            model.set_reshard_after_backward(i == n - 1)
        # each micro-batch in its own tensor, as a data loader hands it over: a view would keep the
        # whole step's tokens alive in what the embedding and the loss save for backward
        xb, yb = x[i * mbs:(i + 1) * mbs].clone(), y[i * mbs:(i + 1) * mbs].clone()
        loss = s.loss_fn(model(xb), yb)
        (loss / n).backward()
        total += loss.item()
    return total / n


def _inputs_and_targets(s: _Setup, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input tokens and next-token targets: its data-parallel rows, and under context
    parallelism its cp rank's positions of the sequence (context_parallel.chunk_positions)."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    if s.ring is not None:
        keep = s.ring.positions[s.ring.rank].to(tokens.device)
        x, y = x[:, keep].contiguous(), y[:, keep].contiguous()
    return x, y


def _forward_backward(s: _Setup, tokens: torch.Tensor, measure: bool) -> float | None:
    """One step's forward and backward; with ``measure`` under the saved-tensor hooks, whose host
    cost is why they only run in the first step (which the median leaves out)."""
    if not measure:
        return _step(s, *_inputs_and_targets(s, tokens))
    s.tracker.enabled = True
    with s.tracker.hooks():
        loss = _step(s, *_inputs_and_targets(s, tokens))
    s.tracker.close()
    s.tracker.enabled = False
    return loss


def _synchronize_gradients(s: _Setup) -> None:
    """After backward: pending partial sums resolved, tied embeddings summed over the pipeline pair
    (a sum that commutes with the data-parallel mean), then the data-parallel reduction of ZeRO-0
    (all-reduce) or ZeRO-1 (reduce-scatter); FSDP (ZeRO-2/3) reduced during backward."""
    p = s.cfg.parallel
    if p.zero_stage <= 1 or s.mixed:   # the master-weight optimizer steps local tensors
        resolve_partial_gradients(s.params)
    if s.tied is not None:
        s.tied.sync()
    if s.replicas > 1 and p.zero_stage == 1:
        s.optimizer.reduce_gradients()
    elif s.averager is not None:
        s.averager()


def run_distributed(cfg: RunConfig, device: torch.device, on_step=None, probe_before_us: float | None = None) -> dict:
    """Train ``cfg`` on this rank; per-step global loss, gradient norm and time, and memory by part.

    A step's time runs from a barrier that lines the ranks up to the end of this rank's optimizer
    step (forward, backward, gradient reduction, optimizer), split into those phases; the slowest
    rank's is the step time. The measurements (gradient norm, bytes) are taken outside it, and the
    saved-tensor hooks only run in the first step, which the median leaves out. The process CPU
    time of the same interval is kept too: on a shared machine it shows how much of the wall time
    was this rank's own work. ``on_step(k)``, when given, is called after step k (progress).
    ``probe_before_us``: the host probe taken right after the previous run of the same launch; it
    stands for this run's first one (only this run's set-up lies between them)."""
    p = cfg.parallel
    rank = dist.get_rank()
    s = _Setup(cfg, device)
    losses, norms, times, cpu_times = [], [], [], []
    phases: dict[str, list[float]] = {"forward_backward": [], "gradient_sync": [], "optimizer": []}
    memory: dict[str, int | None] = {}
    sharded_at_rest = parameter_bytes(s.modules)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    probes = [_host_probe_us(device) if probe_before_us is None else probe_before_us]
    for step in range(cfg.steps):
        tokens = global_batch(step, cfg.global_batch_size, cfg.seq_length, cfg.model.vocab_size, cfg.seed)
        local = dp_slice(tokens, s.coords.dp, p.dp).to(device)
        _sync(device)
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = _forward_backward(s, local, measure=step == 0)
        _sync(device)
        t_fb = time.perf_counter()
        _synchronize_gradients(s)
        if cfg.inject_failure is not None and tuple(cfg.inject_failure) == (rank, step):
            raise InjectedFailure(f"injected failure on rank {rank} at step {step}")
        _sync(device)
        t_sync = time.perf_counter()
        s.optimizer.step()
        _sync(device)
        end = time.perf_counter()
        times.append(end - start)
        cpu_times.append(time.process_time() - cpu_start)
        for name, value in zip(phases, (t_fb - start, t_sync - t_fb, end - t_sync)):
            phases[name].append(value)
        stats = torch.tensor([_owned_grad_sq(s), loss if (loss is not None and s.coords.tp == 0) else 0.0],
                             dtype=torch.float64)
        dist.all_reduce(stats)
        norms.append(float(stats[0]) ** 0.5)
        losses.append(float(stats[1]) / (p.dp * p.cp))   # every cp rank holds an equal share of the tokens
        if on_step is not None:
            on_step(step)
        if step == 0:
            memory["gradients"] = gradient_bytes(s.modules)
            host = tensor_bytes(host_state_tensors(s.optimizer))
            memory["optimizer"] = tensor_bytes(optimizer_state_tensors(s.optimizer)) - host
            memory["host_optimizer"] = host
            memory["host_embedding"] = tensor_bytes(s.optimizer.table_tensors()) if s.table else 0
            memory["gradients"] -= tensor_bytes(p.grad for p in s.table if p.grad is not None)
        s.optimizer.zero_grad(set_to_none=True)
    probes.append(_host_probe_us(device))
    memory["parameters"] = s.probe.compute_bytes if s.probe.compute_bytes is not None else sharded_at_rest
    memory["parameters"] -= tensor_bytes(s.table)       # a host table is the host's (host_embedding)
    memory["host_params"] = 0
    if p.offload_params:    # CPUOffloadPolicy keeps the shards and their gradients on the host: none at rest here
        memory["host_params"] = sharded_at_rest + memory["gradients"]
        memory["parameters"] = memory["gradients"] = 0
    memory["fsdp_sharded_copy"] = sharded_at_rest if (p.zero_stage == 2 and s.replicas > 1) else 0
    memory["activations_per_microbatch"] = s.tracker.first_microbatch_bytes()
    memory["activations_in_flight"] = s.tracker.peak_bytes
    memory["host_activations"] = s.tracker.host_peak_bytes
    memory["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "name": cfg.name, "rank": rank,
        "coords": {"pp": s.coords.pp, "dp": s.coords.dp, "tp": s.coords.tp, "cp": s.coords.cp},
        "stages": [stage for stage, _ in s.chunks],
        "layers": [list(c.layer_ids) for _, c in s.chunks],
        "losses": losses, "grad_norms": norms, "step_times_s": times,
        "median_step_time_s": statistics.median(times[1:] if len(times) > 1 else times),
        "cpu_step_times_s": cpu_times,
        "phase_times_s": phases,
        "median_phase_times_s": {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in phases.items()},
        "median_cpu_step_time_s": statistics.median(cpu_times[1:] if len(cpu_times) > 1 else cpu_times),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "host_probe_us": probes,
        "memory_bytes": memory,
        # the data-parallel all-reduces one step issued (ZeRO-0: one per gradient bucket)
        "dp_collectives_per_step": s.averager.collectives_per_step if s.averager is not None else None,
    }


def _host_probe_us(device: torch.device) -> float:
    """``advisor calibrate``'s host-speed probe (one tiny layer's forward and backward), on every
    rank at once right before and after the timed steps: how fast this machine ran during the run
    next to how fast it ran when it was calibrated (virtual machines drift)."""
    from advisor.executor.host_probe import layer_host_us

    dist.barrier()
    return layer_host_us(device, lambda: _sync(device), repeats=60)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
