"""Context parallelism: each sequence split over the cp ranks, attention as a ring (Liu et al. 2023,
"Ring Attention with Blockwise Transformers"; Megatron-Core's --cp-comm-type p2p, TransformerEngine's
AttnFuncWithCPAndKVP2P).

* Sequence split: 2 x cp chunks, rank r keeps chunks r and 2cp - 1 - r (the head-tail load balance of
  Megatron-Core's get_batch_on_this_cp_rank and PyTorch's context_parallel), so every rank has the
  same share of the causal mask's work. A rank's tokens keep their global positions (rotary,
  learned positions, the mask).
* Forward: the rank's K and V blocks travel around the cp ring in cp - 1 steps (each step's send and
  receive posted before the block in hand is computed); every block is attended blockwise in fp32
  and merged by log-sum-exp. Each block is computed whole, its masked entries included: a causal
  ring kernel (TransformerEngine's) skips the half of an off-diagonal block the mask hides, so the
  executor's attention arithmetic on cp ranks is up to about twice a fused kernel's (a time-only
  difference, which the step-time check of a context-parallel plan includes). Kept for backward, as
  a fused (flash) kernel keeps them: q, the local k and v, the output and the fp32 log-sum-exp (4
  bytes per head and token).
* Backward: the K and V blocks go round the ring again, each carrying the fp32 gradient of its K and
  V accumulated by the ranks it has passed; after cp steps it is back with its owner.

There is no s x s matrix kept: plans with context parallelism use fused attention (the framework
records' cp_unfused_attention).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def chunk_ranges(seq_length: int, cp: int, cp_rank: int) -> tuple[tuple[int, int], ...]:
    """The (start, stop) position ranges a cp rank keeps: chunks r and 2cp - 1 - r of 2cp."""
    if cp == 1:
        return ((0, seq_length),)
    size = seq_length // (2 * cp)
    return ((cp_rank * size, (cp_rank + 1) * size), ((2 * cp - 1 - cp_rank) * size, (2 * cp - cp_rank) * size))


def chunk_positions(seq_length: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The global positions of the tokens a cp rank keeps, in order."""
    return torch.cat([torch.arange(a, b) for a, b in chunk_ranges(seq_length, cp, cp_rank)])


class CPGroup:
    """This rank's cp ring: its process group, its index, the global ranks it sends to and receives
    from, and every cp rank's token positions."""

    def __init__(self, group, cp: int, cp_rank: int, seq_length: int):
        self.group, self.cp, self.rank = group, cp, cp_rank
        ranks = dist.get_process_group_ranks(group)
        self.next = ranks[(cp_rank + 1) % cp]
        self.prev = ranks[(cp_rank - 1) % cp]
        self.ranges = [chunk_ranges(seq_length, cp, r) for r in range(cp)]
        self.positions = [chunk_positions(seq_length, cp, r) for r in range(cp)]

    def exchange(self, *send: torch.Tensor) -> tuple[list[torch.Tensor], list]:
        """Post, in one batch, the sends of ``send`` to the next rank and the receives of the previous
        rank's tensors of the same shapes; (the receive buffers, the works to wait on)."""
        recv = [torch.empty_like(t) for t in send]
        ops = [op for t, r in zip(send, recv) for op in (dist.P2POp(dist.isend, t, self.next, self.group),
                                                          dist.P2POp(dist.irecv, r, self.prev, self.group))]
        return recv, dist.batch_isend_irecv(ops)


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    """The blockwise softmax's dtype: fp32, or fp64 for fp64 runs (the executor's exactness check)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rows(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[b, heads, s, d] -> [b, kv_heads, groups * s, d]: the query heads of one kv group as rows."""
    b, heads, s, d = q.shape
    return q.reshape(b, kv_heads, (heads // kv_heads) * s, d)


def _scores(rows: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, scale: float):
    scores = torch.matmul(rows, k.transpose(-1, -2)) * scale
    return scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: CPGroup):
        kv_heads, d = k.shape[1], q.shape[-1]
        groups = q.shape[1] // kv_heads
        scale = 1.0 / math.sqrt(d)
        q_pos = ring.positions[ring.rank].to(q.device).repeat(groups)
        work = _work_dtype(q)
        rows = _rows(q, kv_heads).to(work)
        out = torch.zeros_like(rows)
        lse = torch.full(rows.shape[:-1], float("-inf"), dtype=work, device=q.device)
        block = torch.stack([k, v])
        for step in range(ring.cp):
            pending = ring.exchange(block) if step < ring.cp - 1 else None
            source = (ring.rank - step) % ring.cp
            kb, vb = block[0].to(work), block[1].to(work)
            scores = _scores(rows, kb, q_pos, ring.positions[source].to(q.device), scale)
            block_lse = torch.logsumexp(scores, dim=-1)
            safe = torch.where(torch.isinf(block_lse), torch.zeros_like(block_lse), block_lse)
            block_out = torch.matmul(torch.exp(scores - safe.unsqueeze(-1)), vb)
            new_lse = torch.logaddexp(lse, block_lse)
            out = (out * torch.exp(lse - new_lse).unsqueeze(-1)
                   + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1))
            lse = new_lse
            if pending is not None:
                (block,), works = pending
                for w in works:
                    w.wait()
        # laid out [b, s, heads, d] in memory, as fused kernels write it, so that the output projection's
        # [b, s, h] input is a view of it rather than a second copy
        b, heads, s, d = q.shape
        out = out.to(q.dtype).reshape(b, kv_heads, groups, s, d).permute(0, 3, 1, 2, 4)
        out = out.reshape(b, s, heads, d).contiguous().transpose(1, 2)
        ctx.ring, ctx.scale = ring, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        kv_heads = k.shape[1]
        groups = q.shape[1] // kv_heads
        q_pos = ring.positions[ring.rank].to(q.device).repeat(groups)
        work = _work_dtype(q)
        rows = _rows(q, kv_heads).to(work)
        drows = _rows(dout.contiguous(), kv_heads).to(work)
        delta = (drows * _rows(out.contiguous(), kv_heads).to(work)).sum(-1, keepdim=True)
        dq = torch.zeros_like(rows)
        block = torch.stack([k, v])
        dkv = torch.zeros(block.shape, dtype=work, device=q.device)
        for step in range(ring.cp):
            source = (ring.rank - step) % ring.cp
            kb, vb = block[0].to(work), block[1].to(work)
            scores = _scores(rows, kb, q_pos, ring.positions[source].to(q.device), scale)
            probs = torch.exp(scores - lse.unsqueeze(-1))
            dkv[1] += torch.matmul(probs.transpose(-1, -2), drows)
            dscores = probs * (torch.matmul(drows, vb.transpose(-1, -2)) - delta)
            dq += torch.matmul(dscores, kb) * scale
            dkv[0] += torch.matmul(dscores.transpose(-1, -2), rows) * scale
            # the block and its gradient so far move on; after cp moves the gradient is home
            if step < ring.cp - 1:
                (block, dkv), works = ring.exchange(block, dkv)
            else:
                (dkv,), works = ring.exchange(dkv)
            for w in works:
                w.wait()
        return dq.to(q.dtype).reshape(q.shape), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: CPGroup) -> torch.Tensor:
    """Causal attention of this rank's queries [b, heads, s/cp, d] over the whole sequence, with
    k, v [b, kv_heads, s/cp, d] of this rank (see the module doc)."""
    return _RingAttention.apply(q, k, v, ring)
