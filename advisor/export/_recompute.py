"""The recomputation a plan was priced with, as each export target must write it.

advisor.cost.recompute prices "selective" by the plan's framework: Megatron's recompute modules (the
attention core by default; also advisor's executor under "pytorch"), torchtitan's op-level selective checkpointing, MindFormers'
select_recompute. An export writes exactly that policy or, where its target has no such switch,
writes no recomputation setting and reports why: it never writes another mode (a different policy
changes memory and time from what was priced).
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.plan import Plan

NONE, FULL, CORE_ATTENTION, OP_LEVEL, MINDSPORE_SELECT = "none", "full", "core-attention", "op-level", "mindspore-select"
# the framework records' selective policies (advisor.specs.frameworks: selective_recompute) that are not
# Megatron-style module lists
POLICY_KINDS = {("op_sac",): OP_LEVEL, ("ffn_act", "math_scores"): MINDSPORE_SELECT}


@dataclass(frozen=True)
class PricedRecompute:
    kind: str                           # one of the constants above
    layers: int | tuple[int, ...] | None = None   # recomputed layers per stage (None: all)
    modules: tuple[str, ...] = ("core_attn",)      # CORE_ATTENTION: Megatron's recompute modules

    def describe(self) -> str:
        counts = "" if self.layers is None else f" of {self.layers} layer(s) per stage"
        modules = "attention core" if self.modules == ("core_attn",) else f"recompute modules {', '.join(self.modules)}"
        return {NONE: "no recomputation", FULL: "full recomputation", CORE_ATTENTION: "Megatron-style selective "
                f"recomputation ({modules})", OP_LEVEL: "torchtitan op-level selective checkpointing",
                MINDSPORE_SELECT: "MindFormers select_recompute (SwiGLU SiLU and Mul)"}[self.kind] + counts


def priced_recompute(plan: Plan) -> PricedRecompute:
    """What the plan's recomputation means under its framework."""
    s, j = plan.strategy, plan.training
    if s.recompute == "none":
        return PricedRecompute(NONE)
    if s.recompute == "full":
        return PricedRecompute(FULL, s.recompute_layers)
    units = j.framework_record.selective_recompute
    if units in POLICY_KINDS:
        return PricedRecompute(POLICY_KINDS[units], s.recompute_layers)
    return PricedRecompute(CORE_ATTENTION, s.recompute_layers, units or j.selective_modules)


def cannot_express(target: str, priced: PricedRecompute, closest: str = "") -> str:
    """The unsupported-feature sentence of a target that has no switch for the priced policy."""
    hint = f"; the closest {target} setting is {closest}, which prices differently: re-plan with it" if closest else ""
    return (f"parallel.recompute: the plan was priced with {priced.describe()} (framework setting), which {target} "
            f"cannot express; no recomputation setting was written{hint}")
