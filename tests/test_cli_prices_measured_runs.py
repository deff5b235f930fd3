"""One set of legality rules: every measured run advisor.validation prices (the usable calibration runs and the
published runs) is entered on advisor's own command line, with the flags its settings' records give, and
``advisor estimate`` prints the validation's price, to 1e-9: no run is refused, and none needs a setting the
command line has no flag for."""

from __future__ import annotations

from advisor.validation.cli_check import check_all


def test_every_measured_run_is_entered_on_the_command_line_at_its_validation_price():
    checks = check_all()
    assert len(checks) >= 319
    not_priced = {c.run_id: c.why or f"{c.cli_tokens_per_s} vs {c.validation_tokens_per_s}" for c in checks
                  if not c.as_priced}
    assert not_priced == {}
    # the MoE parallel-folding recipes among them are entered with --fold-experts
    assert sum("--fold-experts" in c.words for c in checks) >= 7
