"""Strategy searchers and what they share: the user's pinned choices and the search summary.

Every searcher is a function ``(model, hardware, cluster, job, pins, top_k, progress) -> SearchOutcome``:
it returns the candidates worth ranking (a StrategyBatch with their mesh orders) and counts of what it
looked at. ``advisor.commands.recommend`` estimates, ranks and reports them; searchers never rank for display.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from advisor.errors import AdvisorError
from advisor.space.strategy import CP_COMM, RECOMPUTE, SCHEDULES, StrategyBatch

# progress(done, total): called by long searches as work completes (units are the searcher's own).
Progress = Optional[Callable[[float, float], None]]

# Pin field -> the command-line flag that sets it (for error messages).
PIN_FLAGS = {
    "dp": "--dp", "tp": "--tp", "pp": "--pp", "cp": "--cp", "ep": "--ep",
    "zero_stage": "--zero", "recompute": "--recompute", "micro_batch_size": "--mbs",
    "virtual_pipeline_stages": "--vpp", "pipeline_schedule": "--schedule",
    "sequence_parallel": "--sequence-parallel", "offload_optimizer": "--offload", "cp_comm": "--cp-comm",
    "offload_params": "--offload-params", "host_embedding": "--host-embedding",
}


@dataclass(frozen=True)
class Pins:
    """Choices fixed by the user; None means searched."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    zero_stage: int | None = None
    recompute: str | None = None
    micro_batch_size: int | None = None
    virtual_pipeline_stages: int | None = None
    pipeline_schedule: str | None = None
    sequence_parallel: bool | None = None
    offload_optimizer: bool | None = None
    cp_comm: str | None = None
    offload_params: bool | None = None
    host_embedding: bool | None = None

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise AdvisorError(f"{PIN_FLAGS[name]} must be a positive integer, got {value!r}")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise AdvisorError(f"--zero must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.recompute is not None and self.recompute not in RECOMPUTE:
            raise AdvisorError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.cp_comm is not None and self.cp_comm not in CP_COMM:
            raise AdvisorError(f"--cp-comm must be one of {', '.join(CP_COMM)}, got {self.cp_comm!r}")
        if self.pipeline_schedule is not None and self.pipeline_schedule not in SCHEDULES:
            raise AdvisorError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.pipeline_schedule!r}")
        if self.offload_params and (self.zero_stage not in (None, 3) or self.offload_optimizer is False):
            raise AdvisorError(f"--offload-params needs ZeRO stage 3 and the optimizer offloaded, got "
                               f"--zero {self.zero_stage}" + (" --no-offload" if self.offload_optimizer is False else ""))
        if self.offload_params and self.host_embedding:
            raise AdvisorError("--offload-params and --host-embedding: parameter offload already keeps every weight "
                               "in host memory; give one of them")

    def pinned(self) -> dict[str, Any]:
        """The fields that are set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def describe(self) -> str:
        """'--tp 8 --zero 1' (for messages)."""
        return " ".join(f"{PIN_FLAGS[k]} {_flag_value(v)}" for k, v in self.pinned().items())


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


@dataclass(frozen=True)
class SearchStats:
    """What a search looked at.

    ``candidates``: complete legal candidates (after the rules and de-duplication), each either
    priced exactly or eliminated by a proven bound; ``scored``: those the cost model priced exactly;
    ``feasible``: the scored ones that fit. ``pruned`` maps a reason to how many were removed: a
    legality rule (counted in the partial combinations it removed, before the later knobs are
    crossed in), a search constraint, or a bound (memory, or cannot reach the top K; counted in
    complete candidates). ``deduplicated`` maps a reason to combinations not generated because a
    kept one is provably equivalent. ``bound_evaluations`` counts candidates priced for bounds."""

    searcher: str
    candidates: int
    scored: int
    feasible: int
    seconds: float
    pruned: dict[str, int] = field(default_factory=dict)
    deduplicated: dict[str, int] = field(default_factory=dict)
    bound_evaluations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "searcher": self.searcher, "candidates": self.candidates, "scored": self.scored,
            "feasible": self.feasible, "seconds": round(self.seconds, 4), "pruned": dict(self.pruned),
            "deduplicated": dict(self.deduplicated),
            "bound_evaluations": self.bound_evaluations,
        }


@dataclass(frozen=True)
class SearchOutcome:
    """The candidates a searcher proposes for ranking (all feasible ones that could place in the
    top K, mesh orders filled in) and its summary. ``operator_strategies`` is per candidate, for the
    operator-level searchers (None otherwise)."""

    finalists: StrategyBatch
    stats: SearchStats
    operator_strategies: tuple[Any, ...] | None = None
