"""Supernet training on a pipeline (advisor.specs.supernet, advisor.search.naspipe): each candidate
block's time on a device, each subnet's forward and backward per stage, and the schedules' makespans.

* A transformer candidate is priced as the model's layer with its own FFN width and heads by the
  transformer cost model (advisor.cost.compute.layer_compute: GEMMs at the device's size-dependent
  efficiency, the attention kernel, the elementwise traffic).
* A convolution candidate: its pointwise GEMMs (h -> 2h GLU input, h -> h output) at the GEMM curve,
  and the norm, GLU, depthwise convolution and residual add as memory-bound passes that read their
  inputs and write their outputs once.
* Each subnet trains for one step on one batch (NASPipe's one-to-one training); its backward on a
  stage includes the optimizer update of the blocks it used there (Adam, memory-bound:
  compute.optimizer_step_s) and, with data parallelism, the all-reduce of their gradients.
* Context switching (``context_switch``; NASPipe's reproducible runtime, hku-systems/naspipe
  reproducible/translation/gpus=4/__init__.py and main_with_runtime.py): the candidates' weights live
  in host memory; a forward pre-hook copies a chosen block's weights to the device (``.cuda()``) and
  a forward hook copies them back (``.cpu()``) while it has no gradient (the backward uses the
  device copies autograd saved), and the update copies them in once more and out after the step:
  two copies each way per subnet and stage, blocking (pageable host memory), none hidden. NASPipe's
  runtime also checkpoints each stage's forward (``cp.checkpoint``), which repeats the forward's
  copies in the backward (``checkpoint`` below).
* Checkpointing (``checkpoint``; NASPipe's runtime wraps each stage's forward in
  ``torch.utils.checkpoint``, reproducible/translation/gpus=4/__init__.py Stage.forward): a stage
  keeps only its input per subnet in flight and recomputes its forward in the backward pass (the
  recomputed forward's activations live once, while that backward runs). The optimizer's states stay on the device,
  where the optimizer created them, so the device holds every candidate's states but only the
  weights and gradients of the blocks of the subnets in flight; each stage's process holds its own
  layers' candidates on the host.
* The embedding and the head are every subnet's. NASPipe's reproducible runs freeze them (their
  gradients are dropped before the optimizer step, hku-systems/naspipe reproducible/translation/
  main_with_runtime.py), so they never hold a subnet back; ``train_shared`` trains them, and then every
  subnet waits for the previous one on the first and last stage (exact, and nearly sequential).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost import comm
from advisor.cost.activations import layer_activation_terms
from advisor.cost.memory import state_bytes_per_param
from advisor.cost.compute import (gemm_time_s, head_compute_s, layer_compute, linear_gemm_time_s, memory_time_s,
                                  optimizer_step_s)
from advisor.cost.placement import pipeline_neighbour_tier, placements
from advisor.cost.naspipe import Schedule, dependencies, sample_subnets, sequential_s, simulate, stage_blocks
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import TrainingJob
from advisor.specs.supernet import SupernetRun, SupernetSpec  # noqa: F401 (SupernetRun re-exported)


CONV_SAVED_ELEMENTS = 6        # per token, in units of h: see _memory_gib


@dataclass(frozen=True)
class SupernetEstimate:
    naspipe: Schedule
    sequential_s: float
    no_dependency: Schedule          # the same pipeline if subnets never shared a block (a bound)
    subnets: int
    tokens_per_subnet: int
    memory_gib: float                # the fullest stage: every candidate's states and the subnets in flight
    capacity_gib: float
    context_switch: bool = False
    checkpoint: bool = False
    host_gib: float = 0.0            # with context switching: every candidate's weights in host memory
    host_capacity_gib: float = float("inf")     # one process's share of its node's host memory

    @property
    def subnets_per_s(self) -> float:
        return self.subnets / self.naspipe.makespan_s

    @property
    def tokens_per_s(self) -> float:
        return self.subnets_per_s * self.tokens_per_subnet

    @property
    def speedup(self) -> float:
        return self.sequential_s / self.naspipe.makespan_s

    @property
    def feasible(self) -> bool:
        return self.memory_gib <= self.capacity_gib and self.host_gib <= self.host_capacity_gib

    def to_dict(self) -> dict:
        # feasible and step_time_s (a subnet's share of the makespan) as every estimate --json has them
        return {"feasible": self.feasible, "step_time_s": self.naspipe.makespan_s / self.subnets,
                "makespan_s": self.naspipe.makespan_s, "sequential_s": self.sequential_s,
                "no_dependency_s": self.no_dependency.makespan_s, "speedup_over_sequential": self.speedup,
                "subnets": self.subnets, "subnets_per_s": self.subnets_per_s, "tokens_per_s": self.tokens_per_s,
                "utilization": self.naspipe.utilization, "overtakes": self.naspipe.overtakes,
                "memory_gib": self.memory_gib, "capacity_gib": self.capacity_gib, "fits": self.feasible,
                "context_switch": self.context_switch, "checkpoint": self.checkpoint, "host_gib": self.host_gib}


def _batch(s: Strategy, num_layers: int) -> StrategyBatch:
    return StrategyBatch.from_strategies([s], num_layers)


def _conv_s(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, tokens: float, kernel: int) -> tuple[float, float]:
    h = net.base.hidden_size
    gemm = float(linear_gemm_time_s(hw, job, job.gemm_dtype, 2.0 * tokens * 2 * h * h)
                 + linear_gemm_time_s(hw, job, job.gemm_dtype, 2.0 * tokens * h * h))
    # elements read and written: LN (h in, h out), GLU (2h in, h out), depthwise conv (h in, h out),
    # residual add (2h in, h out)
    passes = (2 + 3 + 2 + 3) * tokens * h * job.dtype_bytes
    elementwise = float(memory_time_s(hw, passes + kernel * h * job.dtype_bytes))
    return gemm + elementwise, 2.0 * gemm + 2.0 * elementwise


def candidate_times_s(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, s: Strategy) -> np.ndarray:
    """(candidates, 2): forward and backward seconds of one layer of each candidate, per subnet batch."""
    b = _batch(s, net.num_layers)
    tokens = s.micro_batch_size * job.seq_length
    out = []
    for c in net.candidates:
        if c.kind == "conv":
            out.append(_conv_s(net, hw, job, tokens, c.kernel_size))
        else:
            lc = layer_compute(c.layer_model(net.base), hw, job, b, moe_layer=False)
            out.append((float(lc.forward_s[0]), float(lc.backward_s[0])))
    return np.array(out)


def _stage_bounds(s: Strategy, num_layers: int) -> np.ndarray:
    return np.cumsum((0,) + tuple(s.resolved_stage_layers(num_layers)))


# NASPipe's copies of a subnet's blocks per stage (see the module docstring): in and out around the
# forward, and around the update in the backward
FORWARD_COPIES = 2
BACKWARD_COPIES = 2


def _context_switch_s(hw: HardwareProfile, job: TrainingJob, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What NASPipe's context switches add to each subnet's forward and backward on each stage."""
    wb, _, _ = state_bytes_per_param(job)
    copy_s = blocks * wb / (hw.host.pcie_bandwidth_gbps * 1e9)
    return FORWARD_COPIES * copy_s, BACKWARD_COPIES * copy_s


def action_times_s(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, s: Strategy, choices: np.ndarray,
                   train_shared: bool, context_switch: bool = False,
                   checkpoint: bool = False) -> tuple[np.ndarray, np.ndarray, float]:
    """(forward (subnets, pp), backward with updates (subnets, pp), one stage-to-stage transfer)."""
    times = candidate_times_s(net, hw, job, s)
    params = np.array([c.params(net.base) for c in net.candidates], dtype=float)
    bounds = _stage_bounds(s, net.num_layers)
    b = _batch(s, net.num_layers)
    head_s, head_flops = head_compute_s(net.base, hw, job, b)
    head_s = float(head_s[0])
    # the head's GEMM alone: the loss sits outside NASPipe's checkpointed stage, so it is not replayed
    head_gemm_s = float(gemm_time_s(hw, job.compute_dtype, head_flops)[0])
    dp = placements(hw, b, ("dp_cp",))["dp_cp"]
    fwd = np.zeros((len(choices), s.pp))
    bwd = np.zeros_like(fwd)
    blocks = np.zeros_like(fwd)
    for st in range(s.pp):
        picked = choices[:, bounds[st]:bounds[st + 1]]
        fwd[:, st] = times[picked, 0].sum(axis=1)
        bwd[:, st] = times[picked, 1].sum(axis=1)
        used = params[picked].sum(axis=1)
        blocks[:, st] = used
        if train_shared and st == 0:
            used = used + net.base.embedding_params
        if st == s.pp - 1:
            fwd[:, st] += head_s
            bwd[:, st] += 2.0 * head_s
            if train_shared and not net.base.tie_embeddings:
                used = used + net.base.lm_head_params
        bwd[:, st] += optimizer_step_s(hw, used)
        if s.dp > 1:
            bwd[:, st] += comm.group_time_s(hw, "all_reduce", used * job.grad_reduce_bytes, dp)
    if checkpoint:          # the stage's forward again: its blocks and, on the last stage, the head's GEMM
        replay = fwd.copy()
        replay[:, -1] += head_gemm_s - head_s
        bwd = bwd + replay
    if context_switch:
        copies_f, copies_b = _context_switch_s(hw, job, blocks)
        # a checkpointed forward's recomputation copies the blocks in and out once more
        fwd, bwd = fwd + copies_f, bwd + copies_b + (copies_f if checkpoint else 0.0)
    p2p_bytes = s.micro_batch_size * job.seq_length * net.base.hidden_size * job.dtype_bytes
    p2p = float(comm.tier_p2p_time_s(hw, p2p_bytes, pipeline_neighbour_tier(hw, b))[0]) if s.pp > 1 else 0.0
    return fwd, bwd, p2p


def _memory_gib(net: SupernetSpec, job: TrainingJob, s: Strategy, window: int, train_shared: bool,
                context_switch: bool = False, checkpoint: bool = False) -> float:
    """The fullest stage: weights, gradients and optimizer states (advisor.cost.memory's bytes per
    parameter) of every candidate of its layers and of the ends, plus the activations of the subnets
    in flight, each layer at its largest candidate's: a transformer candidate's saved tensors from
    advisor.cost.activations (Korthikanti et al. 2022, term by term); a convolution block keeps its
    input, the norm's output, the 2h projection, the GLU output and the convolution's output for its
    backward: 6 h elements per token. With context switching the candidates' weights and gradients
    are on the device only for the blocks of the subnets in flight (at most one per layer each, the
    largest candidate: autograd keeps the device copies a forward used until its backward), their
    optimizer states for every candidate; with checkpointing as well, autograd keeps only the stage's
    input, so a block's weights are on the device only while it computes (its forward, or its
    recomputation, backward and update), one subnet's at a time."""
    b = _batch(s, net.num_layers)
    tokens = s.micro_batch_size * job.seq_length
    act = max(float(layer_activation_terms(c.layer_model(net.base), job, b, moe_layer=False).no_recompute[0])
              if c.kind == "transformer" else CONV_SAVED_ELEMENTS * tokens * net.base.hidden_size * job.dtype_bytes
              for c in net.candidates)
    wb, gb, ob = state_bytes_per_param(job)
    per_layer = sum(c.params(net.base) for c in net.candidates)
    held = per_layer * (wb + gb + ob)
    if context_switch:
        largest = max(c.params(net.base) for c in net.candidates)
        resident = 1 if checkpoint else min(window, len(net.candidates))
        held = per_layer * ob + resident * largest * (wb + gb)
    stage_input = tokens * net.base.hidden_size * job.dtype_bytes
    if checkpoint:
        # each subnet in flight keeps the stage's input and its output until its backward (NASPipe's
        # runtime holds the outputs it sent: the last stage's are the logits); one recomputed stage
        # lives at a time
        counts = s.resolved_stage_layers(net.num_layers)
        logits = tokens * net.base.vocab_size * job.dtype_bytes
        worst = max(n * (held + act) + window * (stage_input + (logits if i == len(counts) - 1 else stage_input))
                    for i, n in enumerate(counts))
    else:
        worst = max(n * (held + act * window) for n in s.resolved_stage_layers(net.num_layers))
    # frozen ends (NASPipe) hold their weights only
    ends = (net.base.embedding_params + (0 if net.base.tie_embeddings else net.base.lm_head_params)) * (
        wb + gb + ob if train_shared else wb)
    return (worst + ends) / 2.0 ** 30


def estimate_supernet(net: SupernetSpec, hw: HardwareProfile, job: TrainingJob, s: Strategy,
                      run: SupernetRun = SupernetRun()) -> SupernetEstimate:
    choices = sample_subnets(run.subnets, net.num_layers, len(net.candidates), run.seed)
    fwd, bwd, p2p = action_times_s(net, hw, job, s, choices, run.train_shared, run.context_switch, run.checkpoint)
    blocks = stage_blocks(choices, s.resolved_stage_layers(net.num_layers), run.train_shared)
    window = run.window or s.pp
    schedule = simulate(fwd, bwd, p2p, dependencies(blocks), window)
    free = simulate(fwd, bwd, p2p, dependencies(blocks, causal=False), window)
    wb, _, _ = state_bytes_per_param(job)
    layers = max(s.resolved_stage_layers(net.num_layers))        # the fullest stage's process
    host = layers * sum(c.params(net.base) for c in net.candidates) * wb / 2.0 ** 30 if run.context_switch else 0.0
    return SupernetEstimate(schedule, sequential_s(fwd, bwd, p2p), free, run.subnets,
                            s.micro_batch_size * s.dp * job.seq_length,
                            _memory_gib(net, job, s, window, run.train_shared, run.context_switch, run.checkpoint),
                            hw.device.memory_gib, run.context_switch, run.checkpoint, host,
                            hw.host.memory_gib / hw.node.devices_per_node)
