"""The table of global batches that ``recommend --objective time-to-target`` tried."""

from __future__ import annotations

from rich.table import Table

from advisor.render.formatting import count, duration


def batch_table(trials, chosen_batch: int) -> Table:
    table = Table(title="to the target, by global batch: steps, tokens, best plan's tokens/s and wall-clock time")
    for name in ("batch", "tokens/step", "B_crit", "steps", "tokens", "tokens/s", "time", ""):
        table.add_column(name, justify="right" if name else "left")
    for t in trials:
        c = t.convergence
        table.add_row(str(t.global_batch_size), count(c.batch_tokens), count(c.critical_batch_tokens),
                      count(c.steps_to_target), count(c.tokens_to_target), count(t.tokens_per_s),
                      "-" if t.time_to_target_s is None else duration(t.time_to_target_s),
                      "chosen" if t.global_batch_size == chosen_batch else (t.why_not or "")[:60])
    return table
