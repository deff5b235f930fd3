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

A per-stage layer count (``recompute_layers``) applies the policy to that many layers of a stage
and keeps the rest whole (Megatron's --recompute-method block; MindFormers' per-stage lists).
"""

from __future__ import annotations

import numpy as np

from advisor.cost.activations import ActivationTerms
from advisor.space.strategy import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from advisor.specs.job import TrainingJob

NONE, SELECTIVE, FULL = RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL


def _megatron_dropped(terms: ActivationTerms, modules: tuple[str, ...], moe_layer: bool) -> np.ndarray:
    """Bytes Megatron's selective recomputation of `modules` drops from one layer."""
    p = terms.parts
    dropped = np.zeros_like(terms.attention_core)
    if "core_attn" in modules:
        dropped = dropped + terms.attention_core
    if "layernorm" in modules:
        dropped = dropped + p["qkv_input"] + p["fc1_input"]
    if "moe_act" in modules and moe_layer:
        dropped = dropped + p["fc2_input"]
    if "mla_up_proj" in modules:
        dropped = dropped + p["q"] + p["k"] + p["v"]
    if "mlp" in modules and not moe_layer:
        dropped = dropped + p["mlp_inner"] + p["fc2_input"]
    return dropped


def kept_bytes(terms: ActivationTerms, recompute: np.ndarray, job: TrainingJob, gated_mlp: bool,
               moe_layer: bool = False) -> np.ndarray:
    """Bytes one recomputed layer keeps per micro-batch under the candidates' policies."""
    p = terms.parts
    everything = terms.no_recompute
    framework = job.framework
    if framework == "megatron":
        selective = everything - _megatron_dropped(terms, job.selective_modules, moe_layer)
    elif framework == "torchtitan":
        # the first up-projection's output: SwiGLU's gate (half of the gate/up pair), GELU's FC1 output;
        # the MLP output (w2) has the layer input's size
        first_up = p["mlp_inner"] / 2.0 if gated_mlp else p["mlp_inner"]
        selective = terms.layer_input + p["q"] + p["v"] + p["attention_out"] + p["lse"] + first_up + terms.layer_input
    elif framework == "mindspore":
        selective = everything - terms.attention_core - p["fc2_input"]
    else:
        return terms.total(recompute)
    return np.select([recompute == FULL, recompute == SELECTIVE], [terms.layer_input, selective], everything)


def replay_s(recompute: np.ndarray, job: TrainingJob, lc, moe_layer: bool = False) -> np.ndarray:
    """Forward work the backward replays for one recomputed layer (seconds, arrays); lc is the
    layer's advisor.cost.compute.LayerCompute."""
    framework = job.framework
    if framework == "torchtitan":
        selective = lc.alternate_linear_s + lc.elementwise_s
    elif framework == "mindspore":
        selective = lc.activation_s + (lc.attention_core_s if job.attention == "math" else 0.0)
    elif framework == "megatron":
        modules = job.selective_modules
        selective = np.zeros_like(lc.forward_s)
        if "core_attn" in modules:
            selective = selective + lc.attention_core_s
        if "moe_act" in modules and moe_layer:
            selective = selective + lc.activation_s
        if "mla_up_proj" in modules:
            selective = selective + lc.up_projection_s
        if "mlp" in modules and not moe_layer:
            selective = selective + lc.mlp_forward_s
    else:
        selective = lc.attention_core_s
    return np.select([recompute == FULL, recompute == SELECTIVE], [lc.forward_s, selective], 0.0)


def replay_flops(recompute: np.ndarray, job: TrainingJob, lc, moe_layer: bool = False) -> np.ndarray:
    """GEMM and attention FLOPs replayed for one recomputed layer (for HFU)."""
    if job.framework == "torchtitan":
        selective = lc.alternate_linear_flops
    elif job.framework == "megatron":
        modules = job.selective_modules
        selective = (lc.attention_core_flops if "core_attn" in modules else 0.0) + \
            (lc.up_projection_flops if "mla_up_proj" in modules else 0.0) + \
            (lc.mlp_forward_flops if ("mlp" in modules and not moe_layer) else 0.0)
    else:
        selective = lc.attention_core_flops
    return np.select([recompute == FULL, recompute == SELECTIVE], [lc.forward_flops, selective], 0.0)
