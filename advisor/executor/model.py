"""The GPT-style model the executor trains: plain PyTorch modules, no dropout.

Layout (one module tree for the whole model and for every pipeline chunk, so parameter names are
the same whatever the split):

    embed.tok        token embedding              (first chunk only)
    embed.pos        learned position embedding   (first chunk, position_embedding == "learned")
    layers.<i>       transformer block i (global index)
        norm1, attn.{q,k,v,o}, attn.core, norm2, mlp.{fc1,fc2} (gelu) or mlp.{gate,up,down} (swiglu)
    norm             final norm                   (last chunk only)
    head             LM head                      (last chunk; with tied embeddings and one chunk
                                                   it reuses embed.tok.weight)

Attention is the plan's: ``math`` (scores, softmax, weighted sum as separate ops) or ``flash``
(torch's fused scaled_dot_product_attention). There is no dropout (as in Llama-family training),
so the losses are deterministic and comparable with a single-process run, and the bytes kept for
backward follow Korthikanti et al. 2022's per-tensor list minus the dropout masks and outputs:
per layer and micro-batch, at 16-bit, sbh(32 + 2as/h) with math attention and 32sbh plus the
log-sum-exp with flash (GELU, 4h MLP; fused-style RMSNorm and SwiGLU keep only their inputs).
Query heads attend to their key/value group (GQA: consecutive query heads share one kv head), so
a tensor-parallel shard of whole heads stays self-contained.

Initialization is per parameter, from a generator seeded by (seed, parameter name): every rank and
the single-process reference get bit-identical weights whatever part of the model they build.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from advisor.executor.context_parallel import CPGroup, ring_attention
from advisor.executor.ulysses import UlyssesGroup, ulysses_attention


@dataclass(frozen=True)
class ModelConfig:
    """The executed model's shape (a plan's model, or its --tiny shrink)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    ffn_activation: str          # gelu | swiglu
    vocab_size: int
    seq_length: int
    tie_embeddings: bool = False
    norm: str = "layernorm"      # layernorm | rmsnorm
    use_bias: bool = False
    position_embedding: str = "rotary"   # learned | rotary | none
    attention: str = "math"      # math | flash (fused scaled_dot_product_attention)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_params(self) -> int:
        return sum(p.numel() for p in GPT(self, range(self.num_layers), True, True, init_seed=None).parameters())


class _RMSNormFn(torch.autograd.Function):
    """y = x / rms(x) * w, keeping only x and 1/rms for backward (as fused RMSNorm kernels do:
    Apex FusedRMSNorm, Megatron/TransformerEngine); torch's nn.RMSNorm is composite on CPU and
    keeps every intermediate."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, dy):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        dyw = dy * weight
        dx = rstd * (dyw - xhat * (dyw * xhat).mean(-1, keepdim=True))
        dw = (dy * xhat).sum(dim=tuple(range(dy.dim() - 1)))
        return dx, dw, None


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


class _SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up, keeping gate and up only (Megatron's fused bias-SwiGLU: 4sbf bytes at 16-bit)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return dy * up * (sig * (1 + gate * (1 - sig))), dy * silu


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.hidden_size, eps=1e-5)
    return nn.LayerNorm(cfg.hidden_size, eps=1e-5, bias=True)


_ROTARY_CACHE: dict = {}
_MASK_CACHE: dict = {}


def _causal_mask(s: int, groups: int, device, start: int = 0, t: int | None = None) -> torch.Tensor:
    """[groups * s, t] boolean, True where query start + i may not see key j (j > start + i), for each
    group's s x t block (cached); t defaults to s."""
    t = s if t is None else t
    key = (s, groups, str(device), start, t)
    if key not in _MASK_CACHE:
        mask = torch.ones(s, t, dtype=torch.bool, device=device).triu(1 + start)
        _MASK_CACHE[key] = mask.repeat(groups, 1) if groups > 1 else mask
    return _MASK_CACHE[key]


def _additive_mask(s: int, t: int, start: int, device, dtype) -> torch.Tensor:
    """The causal mask of queries start.. over keys 0..t-1 as 0 / -inf (cached): the fused kernel keeps the mask it
    is given for backward, so every layer shares one tensor rather than converting a boolean one each."""
    key = ("additive", s, t, start, str(device), dtype)
    if key not in _MASK_CACHE:
        _MASK_CACHE[key] = torch.zeros(s, t, dtype=dtype, device=device).masked_fill(
            _causal_mask(s, 1, device, start, t), float("-inf"))
    return _MASK_CACHE[key]


def _rotary_tables(s: int, d: int, device, dtype, positions: torch.Tensor | None = None, where=None):
    """cos and sin tables [s, d] for positions 0..s-1 (or the given positions, a context-parallel
    rank's tokens, named by ``where``: their ranges), computed once per shape (shared by all layers,
    like Megatron's)."""
    key = (s, d, str(device), dtype, where)
    if key not in _ROTARY_CACHE:
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        pos = torch.arange(s, device=device) if positions is None else positions.to(device)
        angles = pos.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        _ROTARY_CACHE[key] = (emb.cos().to(dtype), emb.sin().to(dtype))
    return _ROTARY_CACHE[key]


def _rotary(x: torch.Tensor, positions: torch.Tensor | None = None, where=None) -> torch.Tensor:
    """Rotary position embedding (RoFormer, rotate-half form) on [b, heads, s, d]."""
    s, d = x.shape[-2], x.shape[-1]
    cos, sin = _rotary_tables(s, d, x.device, x.dtype, positions, where)
    half = d // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class AttentionCore(nn.Module):
    """Causal attention on q [b, heads, s, d] and k, v [b, kv_heads, s, d]: the part selective
    recompute recomputes (Korthikanti et al. 2022, section 4.2).

    ``math``: scores, softmax and the weighted sum as three ops (keeps the softmax output, a s x s
    per head). Query heads of one kv group are folded into the row dimension so K and V are used
    at their own (GQA) size, never expanded. ``flash``: torch's fused scaled_dot_product_attention
    (keeps its output and the log-sum-exp, no s x s matrix)."""

    def __init__(self, attention: str = "math"):
        super().__init__()
        self.flash = attention == "flash"
        self.ring = None     # a context_parallel.CPGroup: ring attention over the cp ranks
        self.ulysses = None  # an ulysses.UlyssesGroup: all-to-alls over the cp ranks, this attention in between
        self.sharded = None  # an operator_layout.ShardedAttention: a plan's operator layout, on each rank's shards

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.ring is not None:
            return ring_attention(q, k, v, self.ring)
        if self.ulysses is not None:
            return ulysses_attention(q, k, v, self.ulysses, self.attend)
        if self.sharded is not None:
            return self.sharded(q, k, v)
        return self.attend(q, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over the tokens given, all of them in the sequence's order."""
        return causal_attention(q, k, v, self.flash)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flash: bool, start: int = 0) -> torch.Tensor:
    """Causal attention of queries at positions start, start + 1, ... over keys at 0, 1, ... (all of
    them the sequence's when start is 0 and q and k are as long): AttentionCore's math or flash form."""
    b, heads, s, d = q.shape
    kv_heads, t = k.shape[1], k.shape[2]
    whole = start == 0 and s == t
    if flash:
        mask = None if whole else _additive_mask(s, t, start, q.device, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=whole, enable_gqa=kv_heads != heads)
    groups = heads // kv_heads
    rows = q.reshape(b, kv_heads, groups * s, d)
    scores = torch.matmul(rows, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(_causal_mask(s, groups, q.device, start, t), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).reshape(b, heads, s, d)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
        self.head_dim = cfg.head_dim
        self.rotary = cfg.position_embedding == "rotary"
        self.q = nn.Linear(h, h, bias=cfg.use_bias)
        self.k = nn.Linear(h, kv, bias=cfg.use_bias)
        self.v = nn.Linear(h, kv, bias=cfg.use_bias)
        self.o = nn.Linear(h, h, bias=cfg.use_bias)
        self.core = AttentionCore(cfg.attention)
        self.positions: torch.Tensor | None = None   # the tokens' global positions (context parallelism)
        self.position_ranges: tuple | None = None    # the same as (start, stop) ranges (the tables' cache key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.core.sharded is not None:   # an operator layout: the core takes the [b, s, heads x d] projections
            return self.o(self.core(self.q(x), self.k(x), self.v(x)))
        b, s, _ = x.shape
        # -1: the local head count under tensor parallelism (the projections hold whole heads)
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rotary:
            q = _rotary(q, self.positions, self.position_ranges)
            k = _rotary(k, self.positions, self.position_ranges)
        out = self.core(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, ff, bias = cfg.hidden_size, cfg.ffn_hidden_size, cfg.use_bias
        self.swiglu = cfg.ffn_activation == "swiglu"
        if self.swiglu:
            self.gate = nn.Linear(h, ff, bias=bias)
            self.up = nn.Linear(h, ff, bias=bias)
            self.down = nn.Linear(ff, h, bias=bias)
        else:
            self.fc1 = nn.Linear(h, ff, bias=bias)
            self.fc2 = nn.Linear(ff, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(_SwiGLUFn.apply(self.gate(x), self.up(x)))
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then + mlp(norm2(.)).

    Multi-copy (``copies`` > 1; MindSpore's MicroBatchInterleaved, MindFormers' micro_batch_interleave_num):
    the micro-batch is cut along its batch into that many copies, and each sub-layer (attention, MLP) runs on
    every copy before any copy's residual add needs its result. In the forward a tensor-parallel layer's
    collective is issued asynchronously (DTensor's functional collectives hand back an AsyncCollectiveTensor)
    and waited for only where its result is used, so one copy's collective runs while the next copy computes.
    The arithmetic is the whole micro-batch's."""

    copies = 1
    adds = None       # operator layouts (operator_layout): the two residual adds, each in its placements

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.adds is not None:
            x = self.adds[0](self.attn(self.norm1(x)), x)
            return self.adds[1](self.mlp(self.norm2(x)), x)
        if self.copies == 1:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        xs = x.chunk(self.copies, dim=0)
        outs = [self.attn(self.norm1(c)) for c in xs]
        xs = [c + o for c, o in zip(xs, outs)]
        outs = [self.mlp(self.norm2(c)) for c in xs]
        return torch.cat([c + o for c, o in zip(xs, outs)], dim=0)


class LearnedPositions(nn.Module):
    """GPT-2/3 learned absolute positions, added to the token embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.seq_length, cfg.hidden_size))
        # the tokens' global positions as (start, stop) ranges (context parallelism); slices, not an
        # index tensor, so that a sequence-parallel (DTensor) table is sliced the same way
        self.ranges: tuple[tuple[int, int], ...] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ranges is not None:
            return x + torch.cat([self.weight[a:b] for a, b in self.ranges])
        return x + self.weight[: x.shape[1]]


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = LearnedPositions(cfg) if cfg.position_embedding == "learned" else None
        self.out_dtype: torch.dtype | None = None    # a host table (fp32): its lookups cast to the layers' dtype
        self.lookup = None   # an operator_layout.ShardedLookup: a plan's operator layout, on each rank's shard

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) if self.lookup is None else self.lookup(tokens, self.tok.weight)
        if self.out_dtype is not None:
            x = x.to(self.out_dtype)
        return self.pos(x) if self.pos is not None else x


class GPT(nn.Module):
    """The whole model, or one pipeline chunk of it (``layer_ids`` with or without the ends)."""

    def __init__(self, cfg: ModelConfig, layer_ids, has_embedding: bool, has_head: bool,
                 init_seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        self.layer_ids = tuple(layer_ids)
        self.embed = Embedding(cfg) if has_embedding else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in self.layer_ids})
        self.norm = _norm(cfg) if has_head else None
        self.head = None
        if has_head:
            self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings and has_embedding:
                self.head.weight = self.embed.tok.weight
        if init_seed is not None:
            init_parameters(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def apply_host_embedding(model: GPT) -> list[nn.Parameter]:
    """MindSpore's Host&Device training of the word embedding (advisor.cost.host_embedding): the table kept
    in fp32 (its lookups cast to the layers' dtype), its own optimizer on the host. Returns the table's
    parameters (none on a chunk without the embedding)."""
    if model.embed is None:
        return []
    dtype = model.embed.tok.weight.dtype
    model.embed.tok.float()
    if dtype != torch.float32:
        model.embed.out_dtype = dtype
    return [model.embed.tok.weight]


def apply_context_parallel(model: GPT, ring: CPGroup, cp_comm: str = "p2p") -> None:
    """Give every attention its cp ring (p2p: ring attention; a2a: Ulysses all-to-alls over the same group)
    and every position-dependent module this rank's positions."""
    positions = ring.positions[ring.rank]
    ulysses = UlyssesGroup(ring.group, ring.cp, ring.positions) if cp_comm == "a2a" else None
    for block in model.layers.values():
        if ulysses is not None:
            block.attn.core.ulysses = ulysses
        else:
            block.attn.core.ring = ring
        block.attn.positions = positions
        block.attn.position_ranges = ring.ranges[ring.rank]
    if model.embed is not None and model.embed.pos is not None:
        model.embed.pos.ranges = ring.ranges[ring.rank]


def init_parameters(model: GPT, seed: int) -> None:
    """Per-parameter init seeded by name: weights N(0, 0.02), norm weights 1, biases 0.

    A separate LM head copy of a tied embedding (pipeline ends on different ranks) takes the
    embedding's seed, so both copies start equal."""
    tied_alias = model.cfg.tie_embeddings
    with torch.no_grad():
        for name, param in model.named_parameters(remove_duplicate=True):
            seed_name = "embed.tok.weight" if (tied_alias and name == "head.weight") else name
            if name.endswith("bias"):
                param.zero_()
            elif ".norm" in f".{name}" and name.endswith("weight"):
                param.fill_(1.0)
            else:
                gen = torch.Generator().manual_seed(_name_seed(seed, seed_name))
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02)


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over the micro-batch (the vocabulary-parallel loss on one rank)."""
    return _VocabParallelCrossEntropy.apply(logits, targets, None, 0).mean()


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split along the vocabulary across the tensor-parallel group,
    without gathering them (Megatron-LM's vocab_parallel_cross_entropy; Shoeybi et al. 2019, 3):
    all-reduce of the max, of the exp-sum and of the target logit (``group`` None: one rank holds
    the whole vocabulary). Computes in fp32 and keeps the local softmax in the logits' dtype for
    backward (sbv/t elements; 2 bytes each in bf16, as flash-attn's fused cross entropy keeps its
    logits), whose gradient is written in that dtype too. Returns the per-token losses."""

    @staticmethod
    def forward(ctx, logits, targets, group, vocab_start):
        import torch.distributed as dist

        kept_dtype = logits.dtype
        logits = _at_least_fp32(logits)
        local_max = logits.max(dim=-1).values
        if group is not None:
            dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - local_max.unsqueeze(-1)
        local_v = logits.shape[-1]
        inside = (targets >= vocab_start) & (targets < vocab_start + local_v)
        index = torch.where(inside, targets - vocab_start, torch.zeros_like(targets))
        picked = shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1) * inside
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        if group is not None:
            dist.all_reduce(picked, group=group)
            dist.all_reduce(total, group=group)
        softmax = exp.div_(total.unsqueeze(-1)).to(kept_dtype)
        ctx.save_for_backward(softmax, inside, index)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad):
        softmax, inside, index = ctx.saved_tensors
        out = softmax.clone()
        out.scatter_add_(-1, index.unsqueeze(-1), -inside.unsqueeze(-1).to(out.dtype))
        return out.mul_(grad.unsqueeze(-1).to(out.dtype)), None, None, None


class VocabParallelLoss:
    """The loss on vocabulary-sharded logits [b, s, V/t] of one tensor-parallel rank."""

    def __init__(self, group, tp_rank: int, vocab_size: int, tp: int):
        self.group = group
        self.vocab_start = tp_rank * (vocab_size // tp)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _VocabParallelCrossEntropy.apply(logits, targets, self.group, self.vocab_start).mean()
