"""#34: recommend --all-candidates FILE streams every fitting candidate of the enumerator's space as CSV.

The enumerator is the oracle: the table holds every legal candidate that fits (with those that do not, the
space's size), and its best rows are the search's best."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.cost.confidence import pessimistic_tokens_per_s
from advisor.cost.estimate import estimate_batch
from advisor.search import Pins
from advisor.search.all_candidates import PREDICTION_COLUMNS, STRATEGY_COLUMNS, write_all
from advisor.search.enumerate import search, space_size
from tests._cli import run_cli


@pytest.fixture(scope="module")
def table():
    i = resolve_inputs("llama3-8b", "dgx-h100", devices=8, global_batch_size=64, memory_margin=0)
    out = io.BytesIO()
    written = write_all(out, i.model, i.hardware, i.cluster, i.job, Pins())
    rows = list(csv.DictReader(io.StringIO(out.getvalue().decode())))
    return i, written, rows


def test_every_legal_candidate_is_written_or_does_not_fit(table):
    i, written, rows = table
    assert len(rows) == written.rows > 100
    assert written.rows + sum(written.pruned.values()) == written.candidates == space_size(
        i.model, i.hardware, i.cluster, i.job).candidates
    assert all("fit" in why for why in written.pruned)
    header = list(rows[0])
    assert header[:len(STRATEGY_COLUMNS) + len(PREDICTION_COLUMNS)] == list(STRATEGY_COLUMNS + PREDICTION_COLUMNS)
    assert header[-1].startswith("time_") and "time_compute_s" in header
    capacity = i.job.usable_memory_gib(i.hardware.device.memory_gib)
    assert max(float(r["memory_total_gib"]) for r in rows) <= capacity
    # one row per candidate: no two rows are the same strategy
    assert len({tuple(r[c] for c in STRATEGY_COLUMNS) for r in rows}) == len(rows)


def test_the_best_rows_are_the_searchs_best(table):
    i, _, rows = table
    best = search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=1, distinct_layouts=False).finalists
    e = estimate_batch(i.model, i.hardware, i.cluster, i.job, best)
    assert max(float(r["tokens_per_s"]) for r in rows) == pytest.approx(float(e.tokens_per_s.max()), rel=1e-5)
    banded = search(i.model, i.hardware, i.cluster, i.job, Pins(), top_k=1).finalists
    e = estimate_batch(i.model, i.hardware, i.cluster, i.job, banded)
    low = pessimistic_tokens_per_s(i.model, i.hardware, i.job, banded, e)
    assert max(float(r["tokens_per_s_low"]) for r in rows) == pytest.approx(float(np.max(low)), rel=1e-5)
    # each row's time parts add up to its step time
    parts = [c for c in rows[0] if c.startswith("time_")]
    for r in rows[:50]:
        assert sum(float(r[c]) for c in parts) == pytest.approx(float(r["step_time_s"]), rel=1e-4)


def test_the_command_writes_the_table_and_refuses_other_searchers(monkeypatch, capsys, tmp_path):
    out = tmp_path / "all.csv"
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--gbs", "64", "--pp", "2", "--all-candidates", str(out), "--json")
    assert code == 0, err
    assert "legal candidates fit and are written to" in err
    rows = list(csv.DictReader(out.open()))
    assert rows and {r["pp"] for r in rows} == {"2"}           # the pins hold
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--searcher", "drec", "--all-candidates", str(out))
    assert code == 2 and "--searcher enumerate" in err
