"""Everyday rough edges (issue 12): bandwidths with units, the reference GEMM curve for a profile
without one, partial-node warnings, the closest pair of changes, one step-time format, --help at any
width, and `advisor list` with size and source."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import typer
import yaml

from advisor.cli import app
from advisor.errors import AdvisorError
from advisor.render.formatting import count, step_time
from advisor.commands.inputs import resolve_inputs
from advisor.commands.estimate_request import strategy_from_values
from advisor.search.neighbours import closest_fit, single_knob_changes
from advisor.specs.hardware import PROFILES_DIR, hardware_from_dict, load_hardware
from advisor.specs.input_notes import input_warnings
from advisor.specs.job import Cluster
from advisor.specs.units import bandwidth_gbps
from advisor.cost.estimate import estimate


def _cli(*args, columns: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "advisor", *args], capture_output=True, text=True, env=env, timeout=120)


def _a100() -> dict:
    return copy.deepcopy(load_hardware("dgx-a100-80g").raw)


# ---- bandwidths with units ---------------------------------------------------------------------
@pytest.mark.parametrize("text, gbps", [("200Gb/s", 25.0), ("25GB/s", 25.0), ("900 GB/s", 900.0), ("400Gbps", 50.0),
                                        ("100 Gbit/s", 12.5), ("3.35TB/s", 3350.0), ("800 MB/s", 0.8),
                                        ("25GBps", 25.0), ("1 GiB/s", 1.073741824)])
def test_bandwidth_units_convert_to_gb_per_s(text, gbps):
    assert bandwidth_gbps(text, "bandwidth_gbps", "p") == pytest.approx(gbps)


def test_plain_numbers_keep_meaning_gb_per_s():
    assert bandwidth_gbps(25, "k", "p") == 25
    assert bandwidth_gbps("6.5e2", "k", "p") == "6.5e2"      # a number as a string: the loader reads it as GB/s


@pytest.mark.parametrize("text", ["25 gbps", "25 GB", "fast", "25 furlongs/s", "GB/s"])
def test_unknown_or_ambiguous_units_are_refused_naming_key_and_value(text):
    with pytest.raises(AdvisorError) as err:
        bandwidth_gbps(text, "bandwidth_gbps", "prof.yaml: inter_node")
    message = str(err.value)
    assert "prof.yaml: inter_node" in message and "bandwidth_gbps" in message and text[:10] in message


def test_profile_with_unit_strings_loads_as_the_numbers():
    raw = _a100()
    raw["inter_node"]["bandwidth_gbps"] = "200Gb/s"                  # one HDR NIC per GPU
    raw["node"]["intra_node"]["bandwidth_gbps"] = "300 GB/s"
    raw["device"]["memory_bandwidth_gbps"] = "2.039TB/s"
    raw["host"]["pcie_bandwidth_gbps"] = "256Gbps"
    hw, ref = hardware_from_dict(raw, "units.yaml"), load_hardware("dgx-a100-80g")
    assert hw.inter.bandwidth_gbps == pytest.approx(25.0)
    assert hw.node.intra.bandwidth_gbps == pytest.approx(300.0)
    assert hw.device.memory_bandwidth_gbps == pytest.approx(2039.0)
    assert hw.host.pcie_bandwidth_gbps == pytest.approx(32.0)
    assert hw.raw["inter_node"]["bandwidth_gbps"] == pytest.approx(25.0)   # plans record GB/s numbers
    assert hw.device == ref.device and hw.inter == ref.inter and hw.node == ref.node and hw.host == ref.host
    assert raw["inter_node"]["bandwidth_gbps"] == "200Gb/s"               # the caller's mapping is not changed


def test_bad_unit_in_a_profile_names_the_place():
    raw = _a100()
    raw["inter_node"]["bandwidth_gbps"] = "200 gbps"
    with pytest.raises(AdvisorError, match=r"units.yaml: inter_node: key 'bandwidth_gbps' = '200 gbps'"):
        hardware_from_dict(raw, "units.yaml")


# ---- reference GEMM curve ----------------------------------------------------------------------
@pytest.mark.parametrize("device, reference", [("A100-PCIE-40GB", "dgx-a100-80g"), ("NVIDIA L40S", "dgx-a100-80g"),
                                               ("H800-SXM5-80GB", "dgx-h100"), ("Ascend-910", "ascend-910"),
                                               ("Ascend 910B3", "ascend-910b"), ("B200-SXM", "dgx-b200"),
                                               ("GB300", "dgx-b300"),
                                               ("Tesla V100-PCIE-16GB", "dgx-v100")])
def test_profile_without_a_gemm_curve_takes_its_reference_class_and_says_so(device, reference):
    raw = _a100()
    raw["device"]["name"] = device
    del raw["device"]["matmul_efficiency"]
    hw = hardware_from_dict(raw, "mine.yaml")
    ref = load_hardware(reference).device
    assert hw.device.matmul_efficiency == ref.matmul_efficiency
    assert hw.device.matmul_efficiency_by_dtype == ref.matmul_efficiency_by_dtype
    assert len(hw.notes) == 1 and reference in hw.notes[0] and "matmul_efficiency" in hw.notes[0]
    assert "matmul_efficiency" not in hw.raw["device"]          # re-derived (and noted again) when a plan loads


def test_profile_without_a_gemm_curve_and_an_unknown_device_is_refused():
    raw = _a100()
    raw["device"]["name"] = "MI300X"
    del raw["device"]["matmul_efficiency"]
    with pytest.raises(AdvisorError, match="matmul_efficiency.*MI300X.*no reference device class"):
        hardware_from_dict(raw, "mine.yaml")


def test_bundled_profiles_need_no_reference_curve():
    from advisor.specs.hardware import bundled_hardware
    assert all(load_hardware(name).notes == () for name in bundled_hardware())


# ---- warnings on the command line ---------------------------------------------------------------
def test_partial_node_is_a_warning():
    hw = load_hardware("dgx-a100-80g")
    assert input_warnings(hw, Cluster.of(hw, nodes=2)) == []
    assert input_warnings(hw, Cluster.of(hw, devices=16)) == []
    (text,) = input_warnings(hw, Cluster.of(hw, devices=12))
    assert "12 devices" in text and "8 devices each" in text and "1 full node and 4 of the 8" in text


def test_estimate_prints_warnings_on_stderr_and_in_json(tmp_path):
    raw = _a100()
    raw["device"]["name"] = "A100-PCIE-80GB"
    del raw["device"]["matmul_efficiency"]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    args = ("estimate", "--model", "gpt3-1.3b", "--hardware", str(path), "--devices", "12", "--tp", "2", "--gbs", "48")
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and all(ln.startswith("warning: ") for ln in lines)
    assert "dgx-a100-80g" in lines[0] and "12 devices are not a whole number" in lines[1]
    out = json.loads(_cli(*args, "--json").stdout)
    assert len(out["warnings"]) == 2 and "12 devices" in out["warnings"][1]


# ---- closest change: two knobs when one is not enough --------------------------------------------
def test_closest_fit_names_a_pair_when_no_single_change_fits():
    i = resolve_inputs("gpt3-175b", "dgx-a100-80g", nodes=8, global_batch_size=512)
    s = strategy_from_values(i, {"tp": 1, "pp": 1, "zero_stage": 0, "recompute": "none"})
    assert not estimate(i.model, i.hardware, i.cluster, i.job, s).feasible
    for _, single in single_knob_changes(s):                 # no one change is enough here
        assert not estimate(i.model, i.hardware, i.cluster, i.job, single).feasible
    label, e = closest_fit(i.model, i.hardware, i.cluster, i.job, s)
    assert e.feasible and label.count("--") == 2, label
    assert label == "--zero 3 --recompute full"


def test_closest_single_change_is_still_the_first_that_fits():
    i = resolve_inputs("gpt3-13b", "dgx-a100-80g", nodes=1, global_batch_size=64)
    s = strategy_from_values(i, {"tp": 2, "pp": 1, "zero_stage": 0, "recompute": "none"})
    label, e = closest_fit(i.model, i.hardware, i.cluster, i.job, s)
    assert label == "--zero 1" and e.feasible


# ---- one step-time format ------------------------------------------------------------------------
@pytest.mark.parametrize("seconds, text", [(0.000123456, "0.000123"), (0.0123456, "0.0123"), (0.9996, "1.00"),
                                           (1.23456, "1.23"), (12.3456, "12.3"), (123.456, "123"), (1234.5, "1230"),
                                           (None, "-")])
def test_step_time_has_three_significant_digits(seconds, text):
    assert step_time(seconds) == text


def test_counts_have_three_significant_digits():
    assert [count(n) for n in (334090240, 70553706496, 1008038758400, 20086081)] == ["334M", "70.6B", "1.01T", "20.1M"]


# ---- --help ---------------------------------------------------------------------------------------
def test_every_option_has_help_text():
    command = typer.main.get_command(app)
    missing = [(name, p.opts) for name, sub in command.commands.items() for p in sub.params if not p.help]
    assert missing == []


@pytest.mark.parametrize("columns", [40, 200])
def test_estimate_help_shows_whole_option_names_and_no_bool(columns):
    r = _cli("estimate", "--help", columns=columns)
    assert r.returncode == 0, r.stderr
    assert "<bool>" not in r.stdout and "…" not in r.stdout
    words = set(r.stdout.replace(",", " ").split())
    command = typer.main.get_command(app).commands["estimate"]
    for param in command.params:
        for opt in param.opts + param.secondary_opts:
            assert opt in words, (opt, columns)


# ---- advisor list ----------------------------------------------------------------------------------
def test_list_models_shows_size_and_source():
    r = _cli("list", "models")
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["llama3-70b"])
    assert "70.6B" in row and "80" in row.split() and "Llama Team 2024" in row
    dlrm = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["dlrm-criteo-1tb"])
    assert "recommendation" in dlrm and "24B" in dlrm and "Naumov" in dlrm
    assert "(12.9B active)" in r.stdout                         # mixtral-8x7b


def test_list_hardware_shows_device_devices_memory_and_source():
    r = _cli("list", "hardware")
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["dgx-a100-80g"])
    assert row.split()[1:4] == ["A100-SXM4-80GB", "8", "80"] and "NVIDIA A100" in row
    assert (PROFILES_DIR / "dgx-a100-80g.yaml").is_file()
