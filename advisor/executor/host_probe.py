"""The host-speed probe: one tiny transformer layer's forward and backward on the executor's own
model. ``advisor calibrate`` measures it into a profile (launch_overhead_us); every executor rank
runs it right before and after the timed steps, so a report can say how fast the machine ran
during the run next to when it was calibrated. It lives with the executor's model; calibration
imports it from here (the executor imports nothing of calibration)."""

from __future__ import annotations

import statistics
import time


def layer_host_us(device, sync, repeats: int = 300, warmup: int = 10) -> float:
    """Forward + backward of one transformer layer of the executor's model at a negligible size
    (hidden 32, 8 tokens): what eager PyTorch spends per layer besides the arithmetic. Median
    microseconds over ``repeats`` calls after ``warmup``."""
    import torch

    from advisor.executor.model import Block, ModelConfig

    cfg = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                      ffn_activation="gelu", vocab_size=64, seq_length=8, norm="layernorm", use_bias=True,
                      position_embedding="learned", attention="math")   # the cost model's reference layer
    block = Block(cfg).to(device)
    x = torch.randn(1, 8, 32, device=device, requires_grad=True)
    for _ in range(warmup):
        block(x).sum().backward()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(x).sum().backward()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6
