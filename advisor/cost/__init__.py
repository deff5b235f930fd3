"""Cost model: memory, compute, communication and pipeline bubble; estimate() orchestrates them."""

from advisor.cost.estimate import Estimate, EstimateBatch, estimate, estimate_batch

__all__ = ["Estimate", "EstimateBatch", "estimate", "estimate_batch"]
