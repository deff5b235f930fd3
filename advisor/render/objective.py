"""The tables of what ``recommend --objective time-to-target`` (global batches) and ``--objective cost``
(cluster sizes) tried."""

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


def trials_table(trials, result) -> Table:
    """The table for the objective that produced ``trials``."""
    if hasattr(trials[0], "usd_per_million_tokens"):
        return size_table(trials, result.best.cluster.devices)
    return batch_table(trials, result.best.training.global_batch_size)


def size_table(trials, chosen_devices: int) -> Table:
    from advisor.render.formatting import money

    budget = any(t.cost_to_train_usd is not None for t in trials)
    from rich import box

    table = Table(title="by cluster size: the best plan's tokens/s and what a token costs"
                  + (", and the token budget's time and cost" if budget else "")
                  + "; within 5% of the cheapest, the fastest is chosen",
                  box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("nodes", "devices", "tokens/s", "$ per 1M tokens", *(("time", "cost") if budget else ()), ""):
        table.add_column(name, justify="right" if name else "left")
    for t in trials:
        row = [str(t.nodes), str(t.devices), count(t.tokens_per_s) if t.tokens_per_s else "-",
               f"{t.usd_per_million_tokens:.3f}" if t.usd_per_million_tokens is not None else "-"]
        if budget:
            row += [duration(t.time_to_train_s) if t.time_to_train_s else "-",
                    money(t.cost_to_train_usd) if t.cost_to_train_usd else "-"]
        cheapest = t.usd_per_million_tokens is not None and t.usd_per_million_tokens == min(
            x.usd_per_million_tokens for x in trials if x.usd_per_million_tokens is not None)
        mark = "chosen" if t.devices == chosen_devices and t.tokens_per_s else ""
        mark = ", ".join(m for m in (mark, "cheapest" if cheapest else "") if m)
        row.append(mark or (t.why_not or "")[:40])
        table.add_row(*row)
    return table
