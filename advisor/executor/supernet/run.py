"""``advisor execute`` for a supernet plan: the subnets trained on a pipeline of CPU ranks in NASPipe's
order, and one after another in this process; the losses must agree (same seed, data and subnets).

``--tiny`` keeps the layer count, the candidates' kinds and kernels and their relative widths (FFN
width and heads scaled with the hidden size to 32, head size hidden / heads of the base), a 64-token
vocabulary, 16-token sequences and at most 4 sequences per subnet. ``--steps`` is the number of
subnets trained (each trains one step). The action order is NASPipe's schedule for the plan's
hardware, which advisor.commands.supernet.execute_supernet computes with the cost model and hands over
(the executor reads the plan and that order, never the cost model); any order that schedule allows gives
the same losses.
"""

from __future__ import annotations

import json
import time
from typing import Any

from advisor.errors import AdvisorError
from advisor.executor.supernet.model import CandidateShape, NetShape, sequential_losses
from advisor.runtime.files import temporary_folder, write_json
from advisor.runtime.launch import LaunchOptions, launch_module
from advisor.specs.supernet import SupernetRun

TINY_HIDDEN, TINY_VOCAB, TINY_SEQ, TINY_BATCH = 32, 64, 16, 4
# Plain SGD; the check is equality with sequential training, not convergence, so any rate that keeps
# 12-16 steps finite serves (0.05 changes the tiny losses by about 1e-2 per step, well above the tolerance)
LEARNING_RATE = 0.05
TOLERANCE = 1e-5      # the bound for the losses of pipelined vs sequential supernet training


def net_shape(net, batch: int, tiny: bool) -> NetShape:
    base = net.base
    hidden = TINY_HIDDEN if tiny else base.hidden_size
    scale = hidden / base.hidden_size
    head_dim = max(1, hidden // base.num_attention_heads)
    cands = tuple(CandidateShape("conv", kernel=c.kernel_size) if c.kind == "conv" else
                  CandidateShape("transformer", heads=c.num_attention_heads, ffn=max(4, round(c.ffn_hidden_size * scale)))
                  for c in net.candidates)
    return NetShape(base.num_layers, hidden, head_dim, TINY_VOCAB if tiny else base.vocab_size,
                    TINY_SEQ if tiny else base.seq_length, min(batch, TINY_BATCH) if tiny else batch, cands)


def check_plan(plan) -> None:
    s = plan.strategy
    if s.dp != 1 or s.tp != 1 or s.cp != 1:
        raise AdvisorError("the supernet executor runs the pipeline alone (dp = tp = cp = 1); this plan has "
                           f"dp {s.dp}, tp {s.tp}, cp {s.cp}")


def run_supernet(plan, *, choices, orders, overtakes: int, tiny: bool, timeout_s: float = 600.0,
                 workdir: str | None = None, causal: bool = True) -> dict[str, Any]:
    """Train the subnets ``choices`` (one row of candidate indices per subnet) both ways, the pipeline's
    ranks in ``orders`` (per stage, NASPipe's action order), and report the losses, their largest difference
    and times. ``causal``: whether the order kept NASPipe's dependencies (reported)."""
    check_plan(plan)
    net, s = plan.model, plan.strategy
    run = plan.supernet or SupernetRun()
    subnets = len(choices)
    shape = net_shape(net, s.micro_batch_size, tiny)
    layers = s.resolved_stage_layers(net.num_layers)
    bounds = [0]
    for n in layers:
        bounds.append(bounds[-1] + n)
    spec = {"shape": shape.to_dict(), "bounds": bounds, "choices": choices.tolist(), "seed": run.seed,
            "lr": LEARNING_RATE, "train_shared": run.train_shared, "orders": [list(o) for o in orders]}
    started = time.perf_counter()
    reference = sequential_losses(shape, choices.tolist(), run.seed, LEARNING_RATE, run.train_shared)
    sequential_s = time.perf_counter() - started
    with temporary_folder("advisor-supernet-", keep=workdir) as out:
        write_json(out / "spec.json", spec, what="the supernet run")
        launch_module("advisor.executor.supernet.worker", ["--spec", str(out / "spec.json")], out,
                      LaunchOptions(nproc=s.pp, timeout_s=timeout_s, threads_per_rank=1), temporary=workdir is None)
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(s.pp)]
    losses = [ranks[-1]["losses"][str(j)] for j in range(subnets)]
    diff = max(abs(a - b) for a, b in zip(losses, reference))
    return {"kind": "supernet", "model": net.name, "stages": s.pp, "stage_layers": list(layers), "subnets": subnets,
            "tiny": tiny, "train_shared": run.train_shared, "losses": losses, "sequential_losses": reference,
            "max_loss_difference": diff, "losses_match": diff <= TOLERANCE, "tolerance": TOLERANCE,
            "pipeline_s": max(r["seconds"] for r in ranks), "sequential_s": sequential_s,
            "overtakes": overtakes, "causal": causal, "orders": [list(o) for o in orders],
            **({"notes": ["the plan was priced with NASPipe's checkpointing or context switching; the executor keeps "
                          "every candidate of its supernet on its ranks and stores its activations (the same losses)"]}
               if run.context_switch or run.checkpoint else {})}
