"""One set of legality rules: every measured run advisor.validation prices (the usable calibration runs and the
published runs) is entered on advisor's own command line, with the flags its settings' records give, and
``advisor estimate`` prints the validation's price, to 1e-9. The only runs it refuses are the Megatron-Core MoE
parallel-folding layouts (expert parallelism beyond dp x cp, --expert-tensor-parallel-size 1), which the cost model
does not price: any other refusal or difference fails."""

from __future__ import annotations

import pytest

from advisor.validation.cli_check import check_all


@pytest.fixture(scope="module")
def checks():
    return check_all()


def test_every_measured_run_is_entered_on_the_command_line_at_its_validation_price(checks):
    assert len(checks) >= 319
    differ = [(c.run_id, c.cli_tokens_per_s, c.validation_tokens_per_s) for c in checks
              if c.cli_tokens_per_s is not None and not c.as_priced]
    assert differ == []
    refused = {c.run_id: c.why for c in checks if c.cli_tokens_per_s is None}
    assert all("no flag for" not in why for why in refused.values()), refused
    folding = {run: why for run, why in refused.items() if "divide dp x cp and the expert count" in why}
    assert refused == folding, {k: v for k, v in refused.items() if k not in folding}
    assert len(folding) <= 5
    assert sum(c.as_priced for c in checks) >= len(checks) - 5
