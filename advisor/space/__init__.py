"""The strategy space: one candidate (Strategy), batches of candidates (StrategyBatch), legality rules."""

from advisor.space.strategy import RECOMPUTE, SCHEDULES, Strategy, StrategyBatch

__all__ = ["RECOMPUTE", "SCHEDULES", "Strategy", "StrategyBatch"]
