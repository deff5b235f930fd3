"""Strategy searchers and what they share: the user's pinned choices and the search summary.

Every searcher is a function ``(model, hardware, cluster, job, pins, top_k, progress) -> SearchOutcome``:
it returns the candidates worth ranking (a StrategyBatch with their mesh orders) and counts of what it
looked at. ``advisor.commands.recommend`` estimates, ranks and reports them; searchers never rank for display.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Callable, Optional

from advisor.errors import AdvisorError
from advisor.space.strategy import Strategy, StrategyBatch
from advisor.specs.setting import settings_of

MAX_TOP_K = 1000


def check_top_k(top_k) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise AdvisorError(f"--top must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}")



# progress(done, total): called by long searches as work completes (units are the searcher's own).
Progress = Optional[Callable[[float, float], None]]

class _Pinned:
    """What the generated Pins class does (its fields: the searched settings of Strategy, None when searched)."""

    def __post_init__(self) -> None:
        for name, s in SEARCHED:
            value = getattr(self, name)
            if value is not None:
                s.check(value, s.flag)
        if self.offload_params and (self.zero_stage not in (None, 3) or self.offload_optimizer is False):
            raise AdvisorError(f"--offload-params needs ZeRO stage 3 and the optimizer offloaded, got "
                               f"--zero {self.zero_stage}" + (" --no-offload" if self.offload_optimizer is False else ""))
        if self.offload_params and self.host_embedding:
            raise AdvisorError("--offload-params and --host-embedding: parameter offload already keeps every weight "
                               "in host memory; give one of them")

    @classmethod
    def from_values(cls, values: dict[str, Any]):
        """Pins from command-line values by field name (parsed and checked, naming each flag)."""
        records = dict(SEARCHED)
        return cls(**{name: records[name].given(value, name) for name, value in values.items() if value is not None})

    def pinned(self) -> dict[str, Any]:
        """The fields that are set, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def admits(self, s: Strategy) -> bool:
        """Whether a strategy keeps every pinned choice (a refinement of a candidate must not drop one)."""
        return all(getattr(s, name) == value for name, value in self.pinned().items())

    def describe(self) -> str:
        """'--tp 8 --zero 1' (for messages)."""
        return " ".join(f"{PIN_FLAGS[k]} {_flag_value(v)}" for k, v in self.pinned().items())


# The choices recommend searches and the user may pin: Strategy's settings with search=True
SEARCHED = [(fl.name, s) for fl, s in settings_of(Strategy) if s.search]
# Pin field -> the command-line flag that sets it (for error messages)
PIN_FLAGS = {name: s.flag for name, s in SEARCHED}
Pins = make_dataclass("Pins", [(name, f"{fl.type} | None", field(default=None, metadata=fl.metadata))
                               for fl in fields(Strategy) for name, _ in SEARCHED if fl.name == name],
                      bases=(_Pinned,), frozen=True)
Pins.__module__ = __name__
Pins.__doc__ = "Choices fixed by the user; None means searched (one field per searched Strategy setting)."


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
