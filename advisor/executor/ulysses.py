"""Context parallelism as all-to-alls (DeepSpeed-Ulysses: Jacobs et al. 2023, section 3; Megatron-Core's
--cp-comm-type a2a, TransformerEngine's AttnFuncWithCPAndQKVOA2A).

A cp rank holds its tokens of the sequence (the same head-tail chunks as ring attention, so that the
rest of the layer is the same: advisor.executor.context_parallel.chunk_ranges) with every head. Before
attention one all-to-all over the cp group trades the sequence split for a head split: rank j receives
every rank's tokens of its 1/cp of the query heads and of the key/value heads (GQA groups stay whole:
q head i uses kv head i // (heads / kv_heads), and both split into cp contiguous groups), and puts them
in the sequence's own order. Attention then runs over the whole sequence, causal, with the fused kernel
it runs without cp (the layer's own attention core: fused, or the unfused math where a framework runs
that). A second all-to-all trades the head split back for the sequence split. In backward
each all-to-all's gradient is the all-to-all the other way (equal splits), which is the same call.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _AllToAll(torch.autograd.Function):
    """x [cp, ...]: block j goes to cp rank j; block j of the result came from cp rank j."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)       # contiguous, whatever x's strides
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class UlyssesGroup:
    """This rank's cp group for all-to-alls, and the token order: ``order`` puts the ranks' tokens, gathered
    rank after rank, in the sequence's order; ``gathered`` is the inverse (every rank's positions in turn)."""

    def __init__(self, group, cp: int, positions: list[torch.Tensor]):
        self.group, self.cp = group, cp
        self.gathered = torch.cat(positions)
        self.order = torch.argsort(self.gathered)


def _to_heads(x: torch.Tensor, u: UlyssesGroup) -> torch.Tensor:
    """[b, heads, s/cp, d] (this rank's tokens) -> [b, heads/cp, s, d] (this rank's heads, every token)."""
    b, heads, s_local, d = x.shape
    send = x.reshape(b, u.cp, heads // u.cp, s_local, d).transpose(0, 1)
    got = _AllToAll.apply(send, u.group)                       # [source rank, b, heads/cp, s/cp, d]
    tokens = got.permute(1, 2, 0, 3, 4).reshape(b, heads // u.cp, u.cp * s_local, d)
    return tokens.index_select(2, u.order.to(x.device))


def _to_sequence(y: torch.Tensor, u: UlyssesGroup) -> torch.Tensor:
    """[b, heads/cp, s, d] -> [b, heads, s/cp, d], the inverse of _to_heads."""
    b, local_heads, s, d = y.shape
    tokens = y.index_select(2, u.gathered.to(y.device))
    send = tokens.reshape(b, local_heads, u.cp, s // u.cp, d).permute(2, 0, 1, 3, 4)
    got = _AllToAll.apply(send, u.group)                       # [source head group, b, heads/cp, s/cp, d]
    return got.permute(1, 0, 2, 3, 4).reshape(b, u.cp * local_heads, s // u.cp, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: UlyssesGroup,
                      attend: Callable | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries [b, heads, s/cp, d] over the whole sequence, with k, v
    [b, kv_heads, s/cp, d] of this rank, through two all-to-alls (see the module doc); ``attend`` computes
    causal attention over a whole sequence (default: torch's fused kernel)."""
    qh, kh, vh = _to_heads(q, u), _to_heads(k, u), _to_heads(v, u)
    if attend is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=kh.shape[1] != qh.shape[1])
    else:
        out = attend(qh, kh, vh)
    return _to_sequence(out, u)
