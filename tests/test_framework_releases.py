"""#29: a framework narrowed to one of its releases (training setting framework_release, --framework-release):
the search and estimate run only what that release runs, and exports write for it."""

from __future__ import annotations

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.commands.recommend import recommend
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.export.megatron import VERSIONS
from advisor.search import Pins
from advisor.specs.frameworks import FRAMEWORKS, MEGATRON, for_release
from tests._cli import run_cli


def test_megatron_records_each_release_the_export_writes_for():
    """One declaration each: the record's releases are the export's, and what each release runs agrees with the
    flags the export writes for it (Megatron FSDP for ZeRO-2/3, --window-size)."""
    assert MEGATRON.releases == tuple(VERSIONS) and MEGATRON.release == MEGATRON.releases[-1]
    for release, flags in VERSIONS.items():
        record = for_release(MEGATRON, release)
        assert record.release == release
        assert record.label == ("megatron" if release == MEGATRON.releases[-1] else f"megatron {release}")
        assert (2 in record.zero_stages and 3 in record.zero_stages) == flags.megatron_fsdp
        assert record.sliding_window == flags.window_attention
    # narrowing a narrowed record starts from the newest one
    assert for_release(for_release(MEGATRON, "0.13"), "0.15") == MEGATRON
    with pytest.raises(ValueError, match="records the releases 0.13, 0.14, 0.15"):
        for_release(MEGATRON, "0.12")
    assert all(not f.releases for f in FRAMEWORKS.values() if f is not MEGATRON)


def _top(release, top=40, **pins):
    i = resolve_inputs("llama3-8b", "dgx-h100", devices=8, framework="megatron", framework_release=release,
                       global_batch_size=64, memory_margin=0)
    return recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(**pins), top_k=top).plans


def test_the_search_offers_only_what_the_release_runs():
    newest = {p.strategy.zero_stage for p in _top(None)}
    assert {2, 3} & newest          # Megatron FSDP plans exist for 0.15 on this job
    old = _top("0.13")
    assert {p.strategy.zero_stage for p in old} <= {0, 1}
    assert all(p.training.framework_release == "0.13" for p in old)
    # and the export writes for that release without being told
    text = export_plan(old[0], "megatron").files["megatron_pretrain_gpt.sh"]
    assert "Megatron-Core 0.13" in text and "core_v0.13.0" in text


def test_the_command_line_names_what_the_release_does_not_run(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--zero", "3", "--framework-release", "0.13")
    assert code == 2 and "megatron 0.13 runs ZeRO 0, 1 without pipelining" in err
    code, _, err = run_cli(monkeypatch, capsys, "recommend", "--model", "gpt-oss-20b", "--hardware", "dgx-h100",
                           "--nodes", "1", "--framework-release", "0.14")
    assert code == 2 and "Megatron-LM 0.14 has no sliding-window attention" in err and "releases 0.15 have it" in err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--hardware", "dgx-h100",
                           "--devices", "8", "--framework", "deepspeed", "--framework-release", "0.13")
    assert code == 2 and "framework deepspeed has one record" in err
