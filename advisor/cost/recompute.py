"""Activation recomputation as each framework does it: what a layer keeps, what its backward replays.

``recompute`` is none | selective | full; the training setting ``framework`` decides what
"selective" means, so a plan is priced as the framework it names will run it:

* full (all frameworks): only the layer input is kept (2sbh, /t with SP); the backward replays the
  layer's whole forward, its tensor-parallel collectives included (Megatron-LM
  --recompute-granularity full; torchtitan activation_checkpoint.mode = "full"; MindFormers
  recompute: True; PyTorch FSDP activation checkpointing of each block).
* megatron selective: the modules of --recompute-modules (TrainingJob.recompute_modules; Megatron-LM
  arguments.py and transformer_config.py): "core_attn" (the default; Korthikanti et al. 2022
  section 5) drops and replays unfused attention's score tensors (fused attention stores none);
  "layernorm" drops the two norms' outputs (the QKV and FC1 inputs) and replays the norms;
  "moe_act" drops the experts' activation outputs (the expert FC2 inputs) and replays the
  activation function; "mla_up_proj" drops MLA's up-projected Q, K, V and replays the
  up-projection GEMMs; "mlp" drops a dense layer's MLP intermediates (not an MoE layer's: that is
  Megatron's "moe" module) and replays its GEMMs and activation. The norms' replay (two passes over
  the layer input) is not priced: a few sbh bytes of memory traffic against a layer's GEMMs.
* plain pytorch selective: the attention core only (advisor's executor checkpoints the attention
  core), as Megatron's default.
* torchtitan selective: its op-level selective activation checkpointing
  (activation_checkpoint.mode = "selective", selective_ac_option = "op"): inside the checkpointed
  layer the outputs of the matmuls, the attention kernel and the reduce-scatters are saved, except
  every second matmul; everything else (norms, activations, rotary, the skipped matmuls) is
  replayed. Kept: the layer input, Q and V (wq, wv), the attention output and its log-sum-exp, the
  first MLP up-projection's output and the MLP output (w2); replayed: every other linear call and
  the memory-bound kernels.
* mindspore selective: MindFormers' select_recompute with its default operator list
  ['feed_forward\\.mul', 'feed_forward\\.w1\\.activation\\.silu'] (mindformers/models/utils.py
  LayerSetting @v1.3.0): the SwiGLU's SiLU and Mul are replayed and their outputs (the FC2 input) not
  kept; with flash attention off, MindFormers' Llama attention also recomputes its score and
  softmax operators (llama_transformer.py), so the math scores are dropped and replayed too.

Each framework's record (advisor.specs.frameworks, ``selective_recompute``) names the UNITS below its
selective recomputation applies (Megatron: the job's recompute modules); one function prices every
policy, so what a policy keeps, the time its replay costs and the FLOPs it adds to HFU never disagree.

A per-stage layer count (``recompute_layers``) applies the policy to that many layers of a stage
and keeps the rest whole (Megatron's --recompute-method block; MindFormers' per-stage lists).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from advisor.cost.activations import ActivationTerms
from advisor.space.strategy import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from advisor.specs.job import TrainingJob

NONE, SELECTIVE, FULL = RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL


@dataclass(frozen=True)
class Unit:
    """One part of a layer that selective recomputation stops keeping and replays."""

    drops: tuple[str, ...] = ()
    """Activation parts no longer kept: ActivationTerms.parts keys, or "attention_core" (the score tensors)."""
    replays: tuple[str, ...] = ()
    """Forward work the backward replays: LayerCompute's <name>_s seconds and, where it has them, <name>_flops."""
    layers: str = "all"
    """The layers it applies to: "all", "moe" (MoE layers only) or "dense"."""
    math_only: bool = False
    """Only with unfused (math) attention."""
    keeps: tuple[str, ...] | None = None
    """A policy that keeps only these parts (repeated parts count twice; "first_up": the first MLP
    up-projection's output), everything else being replayed."""


UNITS: dict[str, Unit] = {
    # Megatron-Core's --recompute-modules (module docstring)
    "core_attn": Unit(drops=("attention_core",), replays=("attention_core",)),
    "layernorm": Unit(drops=("qkv_input", "fc1_input")),
    "moe_act": Unit(drops=("fc2_input",), replays=("activation",), layers="moe"),
    "mla_up_proj": Unit(drops=("q", "k", "v"), replays=("up_projection",)),
    "mlp": Unit(drops=("mlp_inner", "fc2_input"), replays=("mlp_forward",), layers="dense"),
    # torchtitan's op-level selective activation checkpointing
    "op_sac": Unit(keeps=("layer_input", "q", "v", "attention_out", "lse", "first_up", "layer_input"),
                   replays=("alternate_linear", "elementwise")),
    # MindFormers' select_recompute: SwiGLU's SiLU and Mul; with flash attention off, the scores too
    "ffn_act": Unit(drops=("fc2_input",), replays=("activation",)),
    "math_scores": Unit(drops=("attention_core",), replays=("attention_core",), math_only=True),
}


def selective_units(job: TrainingJob, moe_layer: bool) -> list[Unit]:
    """The units the job's selective recomputation applies to one layer, in UNITS order."""
    named = job.framework_record.selective_recompute or job.selective_modules
    wanted = [UNITS[name] for name in UNITS if name in named]
    return [u for u in wanted if (u.layers == "all" or (u.layers == "moe") == moe_layer)
            and not (u.math_only and job.attention != "math")]


def _part(terms: ActivationTerms, name: str, gated_mlp: bool) -> np.ndarray:
    if name == "attention_core":
        return terms.attention_core
    if name == "layer_input":
        return terms.layer_input
    if name == "first_up":     # SwiGLU's gate (half of the gate/up pair), GELU's FC1 output
        return terms.parts["mlp_inner"] / 2.0 if gated_mlp else terms.parts["mlp_inner"]
    return terms.parts[name]


def kept_bytes(terms: ActivationTerms, recompute: np.ndarray, job: TrainingJob, gated_mlp: bool,
               moe_layer: bool = False) -> np.ndarray:
    """Bytes one recomputed layer keeps per micro-batch under the candidates' policies."""
    everything = terms.no_recompute
    units = selective_units(job, moe_layer)
    keeps = [u for u in units if u.keeps is not None]
    if keeps:
        selective = sum(_part(terms, name, gated_mlp) for name in keeps[0].keeps)
    else:
        dropped = np.zeros_like(terms.attention_core)
        for unit in units:
            for name in unit.drops:
                dropped = dropped + _part(terms, name, gated_mlp)
        selective = everything - dropped
    return np.select([recompute == FULL, recompute == SELECTIVE], [terms.layer_input, selective], everything)


def _replayed(lc, job: TrainingJob, moe_layer: bool, suffix: str) -> np.ndarray:
    out = np.zeros_like(lc.forward_s)
    for unit in selective_units(job, moe_layer):
        for name in unit.replays:
            value = getattr(lc, f"{name}{suffix}", None)
            if value is not None:
                out = out + value
    return out


def replay_s(recompute: np.ndarray, job: TrainingJob, lc, moe_layer: bool = False) -> np.ndarray:
    """Forward work the backward replays for one recomputed layer (seconds, arrays); lc is the
    layer's advisor.cost.compute.LayerCompute."""
    selective = _replayed(lc, job, moe_layer, "_s")
    return np.select([recompute == FULL, recompute == SELECTIVE], [lc.forward_s, selective], 0.0)


def replay_flops(recompute: np.ndarray, job: TrainingJob, lc, moe_layer: bool = False) -> np.ndarray:
    """GEMM and attention FLOPs replayed for one recomputed layer (for HFU): those of the same units
    replay_s prices (memory-bound kernels have none)."""
    selective = _replayed(lc, job, moe_layer, "_flops")
    return np.select([recompute == FULL, recompute == SELECTIVE], [lc.forward_flops, selective], 0.0)
