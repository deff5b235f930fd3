"""Compute slowed by the collectives it hides.

A collective overlapped with compute runs its kernels on the same device as the layers' (NCCL's on SMs
of their own, which the GEMMs then lack, and both on the memory bandwidth), so the compute it hides
under runs slower while it runs. Lee et al. (arXiv 2507.03114, 2025) measured an average compute
slowdown of 18.9% (at most 40%) over GPT and Llama training steps overlapped with their collectives on
4 A100, H100, MI250 and MI210: OVERLAP_COMPUTE_SLOWDOWN, a constant taken at the source's value (not
fitted). Every overlap the cost model grants pays it per hidden second: the data-parallel traffic
(advisor.cost.step's overlap_slowdown part), and inside a layer the tensor-parallel collectives that
userbuffers / async TP or multi-copy hide, the expert-parallel all-to-alls another micro-batch hides and
the context-parallel ring's K/V transfers the block's attention hides (advisor.cost.layer_comm books
them with the collective's exposed seconds). On CPU ranks nothing overlaps, so nothing slows.
"""

from __future__ import annotations

import numpy as np

from advisor.specs.hardware import HardwareProfile

OVERLAP_COMPUTE_SLOWDOWN = 0.189     # compute slower while a collective runs under it (Lee et al. 2025, mean)


def compute_slowdown_s(hw: HardwareProfile, traffic_s, exposed_s, compute_s) -> np.ndarray:
    """Seconds the compute loses to the traffic it hides: OVERLAP_COMPUTE_SLOWDOWN x the hidden seconds (all
    the traffic, ``traffic_s``, less what stays exposed, ``exposed_s``; at most the compute, ``compute_s``, it
    hides under)."""
    if not hw.device.overlaps_communication:
        return np.zeros(np.broadcast(np.asarray(traffic_s, dtype=float), np.asarray(exposed_s, dtype=float)).shape)
    hidden = np.clip(np.asarray(traffic_s, dtype=float) - np.asarray(exposed_s, dtype=float), 0.0,
                     np.asarray(compute_s, dtype=float))
    return OVERLAP_COMPUTE_SLOWDOWN * hidden
