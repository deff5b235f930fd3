"""A hand-written plan's operator_strategies.fixed of the wrong type is refused with one sentence
(AdvisorError, exit 2), not a TypeError from the MindSpore strategy export."""

from __future__ import annotations

from dataclasses import replace

import pytest

from _export_plans import plans
from advisor.errors import AdvisorError
from advisor.export.mindspore_strategy import strategy_files


@pytest.mark.parametrize("fixed", [5, [[1]], "layer.fc1", [1, 2]])
def test_bad_fixed_is_refused(fixed):
    plan = replace(plans()["gpt3_gpipe_fp16"], operator_strategies={"operators": {}, "strategies": {}, "fixed": fixed})
    with pytest.raises(AdvisorError, match="'fixed' must be a list of operator names"):
        strategy_files(plan, [], [])


def test_good_fixed_is_kept():
    plan = replace(plans()["gpt3_gpipe_fp16"],
                   operator_strategies={"operators": {}, "strategies": {}, "fixed": ["layer.fc1"]})
    files = strategy_files(plan, [], [])
    assert set(files) == {"operator_strategies.py", "strategy_ckpt.json"}
