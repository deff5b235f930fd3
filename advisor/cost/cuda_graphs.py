"""CUDA graphs: the host launches captured kernels as one graph instead of one by one.

Megatron-Core captures per-layer graphs (``--cuda-graph-impl local`` or ``transformer_engine``) over
the modules ``--cuda-graph-scope`` names (transformer_config.py, cuda_graph_modules): ``attn`` (the
attention half of a layer), ``mlp`` (a dense layer's MLP), ``moe`` (a MoE layer's MLP: router,
dispatch, experts, combine), ``moe_router`` (a MoE layer's MLP up to the router) with
``moe_preprocess`` (the dispatcher's preprocessing), or the whole layer (an empty scope; advisor
calls it ``full``), or the whole forward and backward of an iteration (``full_iteration``, the
local implementation's FullCudaGraphWrapper: one launch per iteration). A graph replays its kernels
from the device, so the host pays one launch per captured region and pass instead of one per kernel
(CUDA C++ Programming Guide, "CUDA Graphs").

Dropless MoE sizes its experts from token counts that change every step, which a graph cannot
replay: Megatron-Core's configuration refuses the ``moe`` scope for it ("moe cuda graph is only
supported with drop-padding MoE"), and a whole-layer graph holds the same expert computation, which
is why Megatron-Bridge's 25.09 recipes that graphed whole MoE layers on B200/GB200 also dropped
tokens (apply_moe_token_drop). advisor.specs.job.check_cuda_graphs refuses both for dropless MoE.

The kernel counts of a layer (advisor.cost.host_launch: KERNELS_FORWARD, MOE_KERNELS_FORWARD) split as
host_launch.py lists them: of the 16 kernels named for a Megatron layer, 10 belong to the attention half
(norm, QKV GEMM, layout copies, score batched matmul, softmax, dropout, context batched matmul,
output GEMM, TP all-reduce, bias-dropout-add) and 6 to the MLP half (norm, FC1, activation, FC2,
TP all-reduce, bias-dropout-add); in a MoE layer the MLP half's share stands for the norm and the
router. Of the 12 kernels a MoE layer launches after routing (host_launch.MOE_KERNELS_FORWARD, 24
backward), the dispatcher's preprocessing is 2 forward (Megatron-Core's
MoEAlltoAllTokenDispatcher.preprocess: the tokens per expert, routing_map.sum(dim=0).long()) and none
backward (counts carry no gradient); the experts' per-expert GEMMs are never in a moe_preprocess graph.

Not priced: the graphs' static input and output buffers (one set per captured layer and micro-batch
in flight; a few MiB per layer, small beside the saved activations) and the capture at warm-up.
"""

from __future__ import annotations

ATTENTION_SHARE = 10.0 / 16.0
MLP_SHARE = 6.0 / 16.0
PREPROCESS_KERNELS = (2.0, 0.0)        # forward, backward


def captured_share(modules: tuple[str, ...], moe_layer: bool) -> float:
    """Share of a layer's generic kernels (KERNELS_FORWARD/BACKWARD) that run inside graphs."""
    if "full" in modules or "full_iteration" in modules:
        return 1.0
    share = ATTENTION_SHARE if "attn" in modules else 0.0
    mlp_scopes = ("moe", "moe_router") if moe_layer else ("mlp",)
    return share + (MLP_SHARE if any(m in modules for m in mlp_scopes) else 0.0)


def eager_moe_launches(modules: tuple[str, ...], forward, backward):
    """Of the launches a MoE layer makes after routing (forward, backward: arrays or numbers), those
    that stay eager: none under a whole-layer or moe graph, all but the preprocessing's under
    moe_preprocess."""
    if any(m in modules for m in ("full", "full_iteration", "moe")):
        return 0.0 * forward, 0.0 * backward
    if "moe_preprocess" in modules:
        return forward - PREPROCESS_KERNELS[0], backward - PREPROCESS_KERNELS[1]
    return forward, backward


def graph_launches(modules: tuple[str, ...], moe_layer: bool) -> int:
    """Graph launches per layer and pass: one per contiguous captured region (attention and the
    router next to it are one region)."""
    if not modules or "full_iteration" in modules:      # one launch per iteration: nothing per layer
        return 0
    if "full" in modules:
        return 1
    attn = "attn" in modules
    mlp = any(m in modules for m in (("moe", "moe_router") if moe_layer else ("mlp",)))
    return 1 if attn and mlp else int(attn) + int(mlp)
