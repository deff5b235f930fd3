"""A supernet in PyTorch for the executor: every layer holds each candidate block (advisor.specs.supernet);
a subnet runs one candidate per layer. Built identically in every process (one seed), so a stage can
keep its own layers and the sequential reference the whole net.

Blocks, pre-norm with a residual: ``transformer`` (causal attention with the candidate's heads of the
model's head size, then a GELU FFN of the candidate's width) and ``conv`` (GLU projection h -> 2h,
causal depthwise convolution of the candidate's kernel, projection h -> h). Training: plain SGD on the
blocks a subnet used, right after its backward (one step per subnet); the embedding and head train
only with ``train_shared`` (NASPipe freezes them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class CandidateShape:
    kind: str
    heads: int = 0
    ffn: int = 0
    kernel: int = 0


@dataclass(frozen=True)
class NetShape:
    layers: int
    hidden: int
    head_dim: int
    vocab: int
    seq: int
    batch: int
    candidates: tuple[CandidateShape, ...]

    def to_dict(self) -> dict:
        return {"layers": self.layers, "hidden": self.hidden, "head_dim": self.head_dim, "vocab": self.vocab,
                "seq": self.seq, "batch": self.batch, "candidates": [c.__dict__ for c in self.candidates]}

    @staticmethod
    def from_dict(d: dict) -> "NetShape":
        return NetShape(d["layers"], d["hidden"], d["head_dim"], d["vocab"], d["seq"], d["batch"],
                        tuple(CandidateShape(**c) for c in d["candidates"]))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out = nn.Linear(hidden, 3 * width), nn.Linear(width, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class LightConv(nn.Module):
    def __init__(self, hidden: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.norm = nn.LayerNorm(hidden)
        self.inp, self.out = nn.Linear(hidden, 2 * hidden), nn.Linear(hidden, hidden)
        self.conv = nn.Conv1d(hidden, hidden, kernel, groups=hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.glu(self.inp(self.norm(x)), dim=-1).transpose(1, 2)
        y = self.conv(F.pad(y, (self.kernel - 1, 0))).transpose(1, 2)       # causal: only past tokens
        return x + self.out(y)


def block(shape: NetShape, c: CandidateShape) -> nn.Module:
    if c.kind == "conv":
        return LightConv(shape.hidden, c.kernel)
    return Attention(shape.hidden, c.heads, shape.head_dim, c.ffn)


class Supernet(nn.Module):
    def __init__(self, shape: NetShape, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.pos = nn.Embedding(shape.seq, shape.hidden)
        self.layers = nn.ModuleList(nn.ModuleList(block(shape, c) for c in shape.candidates) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def ends(self, first: bool, last: bool) -> list[nn.Parameter]:
        out = list(self.embed.parameters()) + list(self.pos.parameters()) if first else []
        return out + (list(self.norm.parameters()) + list(self.head.parameters()) if last else [])

    def run(self, x: torch.Tensor, choice, lo: int, hi: int, first: bool, last: bool, targets=None):
        """Layers lo..hi-1 of one subnet; the first stage embeds token ids, the last returns the loss."""
        if first:
            x = self.embed(x) + self.pos(torch.arange(x.shape[1]))
        for layer in range(lo, hi):
            x = self.layers[layer][int(choice[layer])](x)
        if last:
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return x

    def used(self, choice, lo: int, hi: int) -> list[nn.Parameter]:
        return [p for layer in range(lo, hi) for p in self.layers[layer][int(choice[layer])].parameters()]


def batch(shape: NetShape, seed: int, subnet: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The subnet's batch: token ids and next-token targets, the same in every process."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + subnet)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


@torch.no_grad()
def sgd(params: list[nn.Parameter], lr: float) -> None:
    """In place on the storage: a subnet whose graph still holds a block (only where the causal order
    is dropped) then computes its backward with the updated weights, the race NASPipe prevents."""
    for p in params:
        if p.grad is not None:
            p.data.add_(p.grad, alpha=-lr)
            p.grad = None


def freeze_ends(net: Supernet, train_shared: bool) -> None:
    for p in net.ends(True, True):
        p.requires_grad_(train_shared)


def sequential_losses(shape: NetShape, choices, seed: int, lr: float, train_shared: bool) -> list[float]:
    """Every subnet trained one after another on one process: the reference."""
    net = Supernet(shape, seed)
    freeze_ends(net, train_shared)
    losses = []
    for j, choice in enumerate(choices):
        x, y = batch(shape, seed, j)
        loss = net.run(x, choice, 0, shape.layers, True, True, y)
        loss.backward()
        sgd(net.used(choice, 0, shape.layers) + (net.ends(True, True) if train_shared else []), lr)
        losses.append(loss.item())
    return losses
