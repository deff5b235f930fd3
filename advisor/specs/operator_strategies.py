"""``--operator-strategies FILE``: strategies a user fixes for some operators (semi-automatic parallelism).

The file (YAML, or JSON when it ends in .json) maps an operator name to the cuts of its inputs, in the
form MindSpore's ``Primitive.shard(in_strategy)`` takes: one tuple per input tensor, one positive
integer per dimension of that tensor, the number of parts the dimension is cut into (MindSpore's
operator-parallel tutorial, mindspore-ai/docs tutorials/source_en/parallel/operator_parallel.md:
``in_strategy=((2, 4), (4, 1))`` cuts the first input's rows in 2 and columns in 4):

    layer.qkv: [[1, 1, 1], [1, 4, 1, 1], [1, 4, 1, 1]]
    layer.fc1: [[2, 1, 1], [1, 4]]

Operator names, input order and tensor shapes are those of advisor's operator graph of the model
(advisor.graph.transformer; ``advisor estimate --operator-strategies`` lists them when a name is
wrong), and the cuts are inside the operator's tensor-parallel group (the data and context
parallelism of the outer configuration come on top, as MindSpore's own strategies cover them; the
MindSpore export multiplies them back in). A plan's ``operator_strategies`` block, or a whole plan,
is accepted too: its ``strategies`` mapping is read, so a completed plan can be fed back.

This module only checks the file's form (every name a string, every cut a positive integer within
limits.MAX_DEVICES); what depends on the model (names, input counts, ranks, divisibility, group
size) is checked against the graph by advisor.search.semi_auto, naming the operator and dimension.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.specs import limits
from advisor.specs._fields import read_mapping
from advisor.specs.untrusted import prefix

# A transformer graph has 14 operators per layer template; a plan fixes each at most once.
MAX_OPERATORS = 10_000
MAX_INPUTS = 64          # inputs of one operator (the graph's largest has 5)
MAX_RANK = 16            # dimensions of one tensor (the graph's largest has 5)

# Megatron-LM's tensor-parallel cut of each operator (by the operator's name within its layer), the
# reference every operator layout is priced against (advisor.search.intra_op) and what an operator a
# plan's layout does not list runs with (advisor.executor.operator_layout); operators not listed are cut
# by sequence with sequence parallelism, else replicated (Shoeybi et al. 2019, section 3; Korthikanti et
# al. 2022, section 4.2.2).
MEGATRON_CUTS = {"embed": "v", "qkv": "g", "attn": "g", "proj": "g", "fc1": "f", "fc2": "f",
                 "expert_fc1": "f", "expert_fc2": "f", "head": "v", "loss": "v"}
SEQUENCE = "s"


@dataclass(frozen=True)
class OperatorStrategies:
    """Operator name -> cuts per input tensor (one tuple of positive ints per input)."""

    cuts: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]
    source: str = "--operator-strategies"

    def as_dict(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        return dict(self.cuts)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.cuts)

    def __len__(self) -> int:
        return len(self.cuts)


def load_operator_strategies(path: str | Path) -> OperatorStrategies:
    """Read and check the form of an operator-strategies file (exit 2 with one sentence when wrong)."""
    p = Path(path)
    if not p.is_file():
        raise AdvisorError(f"--operator-strategies: file not found: {prefix(str(path))}")
    data = read_mapping(p, "operator-strategies file")
    return parse_operator_strategies(data, f"--operator-strategies {p}")


def parse_operator_strategies(data: Any, origin: str) -> OperatorStrategies:
    """The strategies of a parsed mapping: bare, a plan's operator_strategies block, or a whole plan."""
    if isinstance(data, dict) and isinstance(data.get("operator_strategies"), dict):
        data = data["operator_strategies"]           # a whole plan
    if isinstance(data, dict) and "strategies" in data:
        data = data["strategies"]                    # a plan's operator_strategies block
    if not isinstance(data, dict) or not data:
        raise AdvisorError(f"{origin}: expected a mapping of operator names to lists of cuts per input, "
                           f"got {prefix(data)}")
    if len(data) > MAX_OPERATORS:
        raise AdvisorError(f"{origin}: {len(data):,} operators, more than {MAX_OPERATORS:,}")
    out = []
    for name, inputs in data.items():
        where = f"{origin}: operator {prefix(name)}"
        if not isinstance(inputs, list) or not inputs or len(inputs) > MAX_INPUTS:
            raise AdvisorError(f"{where} must map to a list of 1 to {MAX_INPUTS} inputs, each a list of cuts "
                               f"(e.g. [[1, 1, 1], [1, 4]]), got {prefix(inputs)}")
        cuts = []
        for i, dims in enumerate(inputs):
            if not isinstance(dims, list) or len(dims) > MAX_RANK:
                raise AdvisorError(f"{where}, input {i}: expected a list of at most {MAX_RANK} cuts, one per "
                                   f"dimension, got {prefix(dims)}")
            for d, cut in enumerate(dims):
                if isinstance(cut, bool) or not isinstance(cut, int) or cut < 1:
                    raise AdvisorError(f"{where}, input {i}, dimension {d}: a cut must be a positive integer "
                                       f"(1 = not cut), got {prefix(cut)}")
                if cut > limits.MAX_DEVICES:
                    raise AdvisorError(f"{where}, input {i}, dimension {d}: cut {cut:,} is more than "
                                       f"{limits.MAX_DEVICES:,} devices")
            cuts.append(tuple(dims))
        out.append((name, tuple(cuts)))
    return OperatorStrategies(tuple(out), origin)
