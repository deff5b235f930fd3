"""Bundled hardware profiles (hardware_profiles/*.yaml) and the loader's validation of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from advisor.errors import AdvisorError
from advisor.specs.hardware import PROFILES_DIR, bundled_hardware, hardware_from_dict, load_hardware

EXPECTED = {
    "ascend-910",
    "ascend-910b",
    "dgx-v100",
    "dgx-a100-40g",
    "dgx-a100-80g",
    "dgx-h100",
    "dgx-h200",
}


def _raw(name: str) -> dict:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


def _write(tmp_path: Path, data: dict, filename: str = "custom.yaml") -> Path:
    path = tmp_path / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------- bundled profiles


def test_expected_profiles_are_bundled():
    assert EXPECTED <= set(bundled_hardware())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_loads_and_name_matches_file(name):
    prof = load_hardware(name)
    assert prof.name == name
    # loading by path gives the same profile
    assert load_hardware(str(PROFILES_DIR / f"{name}.yaml")) == prof


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_has_source_price_and_power(name):
    prof = load_hardware(name)
    assert prof.source.strip()
    assert prof.price_per_device_hour_usd is not None and prof.price_per_device_hour_usd > 0
    assert prof.power_watts is not None and prof.power_watts > 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_numbers_are_sane(name):
    prof = load_hardware(name)
    dev, node = prof.device, prof.node
    assert dev.peak_tflops and all(v > 0 for v in dev.peak_tflops.values())
    # half-precision tensor throughput is always the headline number
    assert "fp16" in dev.peak_tflops
    curve = dev.matmul_efficiency
    assert len(curve) >= 3
    assert [p[0] for p in curve] == sorted(p[0] for p in curve)
    # efficiency grows with GEMM size and stays a fraction
    assert [p[1] for p in curve] == sorted(p[1] for p in curve)
    assert all(0 < p[1] <= 1 for p in curve)
    # large GEMMs inside a training framework reach 0.6-0.9 of peak (calibrated A100: 0.73)
    assert 0.6 <= curve[-1][1] <= 0.9
    assert 0 < dev.memory_efficiency <= 1
    assert node.devices_per_node % node.group_size == 0
    # the link tiers are ordered fastest first
    assert prof.inter.bandwidth_gbps < node.intra.bandwidth_gbps
    if node.cross is not None:
        assert prof.inter.bandwidth_gbps <= node.cross.bandwidth_gbps < node.intra.bandwidth_gbps
    for link in (node.intra, node.cross, prof.inter):
        if link is not None:
            assert 0 < link.efficiency <= 1
            assert link.latency_us > 0
    assert prof.host.memory_gib > 0 and prof.host.pcie_bandwidth_gbps > 0


@pytest.mark.parametrize(
    "name, intra_gbps, inter_gbps, bf16_tflops, memory_gib",
    [
        ("dgx-a100-40g", 300, 25, 312, 40),
        ("dgx-a100-80g", 300, 25, 312, 80),
        ("dgx-h100", 450, 50, 989.4, 80),
        ("dgx-h200", 450, 50, 989.4, 140),
        ("dgx-b200", 900, 50, 2250, 178.35),
        ("gb200-nvl72", 900, 50, 2500, 186),
        ("dgx-b300", 900, 100, 2250, 279),
        ("gb300-nvl72", 900, 100, 2500, 279),
    ],
)
def test_nvidia_datasheet_numbers(name, intra_gbps, inter_gbps, bf16_tflops, memory_gib):
    prof = load_hardware(name)
    assert prof.node.intra.bandwidth_gbps == intra_gbps
    assert prof.inter.bandwidth_gbps == inter_gbps
    assert prof.device.peak_tflops["bf16"] == pytest.approx(bf16_tflops)
    assert prof.device.memory_gib == memory_gib
    assert prof.node.topology == "switch"


def test_hopper_has_fp8_and_ampere_does_not():
    assert "fp8" in load_hardware("dgx-h100").device.peak_tflops
    assert "fp8" in load_hardware("dgx-h200").device.peak_tflops
    assert "fp8" not in load_hardware("dgx-a100-80g").device.peak_tflops
    with pytest.raises(AdvisorError, match="fp8"):
        load_hardware("dgx-a100-80g").device.peak_flops("fp8")


def test_ascend_910_is_two_hccs_groups_joined_by_pcie():
    prof = load_hardware("ascend-910")
    node = prof.node
    assert node.topology == "mesh-groups"
    assert node.devices_per_node == 8
    assert node.group_size == 4
    assert node.intra.bandwidth_gbps == 90           # 3 HCCS links x 30 GB/s
    assert node.cross is not None
    assert node.cross.bandwidth_gbps < node.intra.bandwidth_gbps
    assert node.cross.effective_bandwidth_bytes_per_s < node.intra.effective_bandwidth_bytes_per_s
    assert node.cross.latency_us >= node.intra.latency_us
    assert prof.inter.bandwidth_gbps == 12.5          # one 100GE port per NPU
    assert "bf16" not in prof.device.peak_tflops      # the 910 has no BF16


def test_ascend_910b_is_full_mesh_with_200ge():
    prof = load_hardware("ascend-910b")
    assert prof.node.topology == "switch"
    assert prof.node.group_size == prof.node.devices_per_node == 8
    assert prof.node.cross is None
    assert prof.inter.bandwidth_gbps == 25            # one 200GE port per NPU
    assert prof.device.memory_gib == 64
    assert "bf16" in prof.device.peak_tflops


def test_dgx_v100_is_a_dgx2():
    prof = load_hardware("dgx-v100")
    assert prof.node.devices_per_node == 16
    assert prof.node.topology == "switch"
    assert prof.device.memory_gib == 32
    assert set(prof.device.peak_tflops) == {"fp32", "fp16"}


# ---------------------------------------------------------------- what-if overrides


def test_with_overrides_changes_inter_node_bandwidth_and_name():
    base = load_hardware("dgx-a100-80g")
    variant = base.with_overrides(inter_node_gbps=50)
    assert variant.inter.bandwidth_gbps == pytest.approx(50 / base.oversubscription)
    assert variant.name != base.name
    assert variant.name.startswith(base.name) and "inter50" in variant.name
    assert variant.raw["inter_node"]["bandwidth_gbps"] == 50
    assert variant.raw["name"] == variant.name
    # the original is untouched
    assert base.inter.bandwidth_gbps == 25
    assert base.raw["inter_node"]["bandwidth_gbps"] == 25
    # everything else is the same
    assert variant.node == base.node and variant.device == base.device


def test_with_overrides_divides_by_oversubscription(tmp_path):
    data = _raw("dgx-h100")
    data["inter_node"]["oversubscription"] = 2.0
    prof = load_hardware(str(_write(tmp_path, data)))
    assert prof.inter.bandwidth_gbps == pytest.approx(25)
    assert prof.with_overrides(inter_node_gbps=100).inter.bandwidth_gbps == pytest.approx(50)


def test_with_overrides_without_arguments_keeps_name():
    base = load_hardware("dgx-h100")
    assert base.with_overrides().name == base.name


# ---------------------------------------------------------------- validation errors


def _expect_error(tmp_path: Path, data: dict, *fragments: str) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(AdvisorError) as info:
        load_hardware(str(path))
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_malformed_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ndevice: {name: x, memory_gib: [1, 2\n")
    with pytest.raises(AdvisorError) as info:
        load_hardware(str(path))
    assert str(path) in str(info.value)
    assert "malformed YAML" in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(AdvisorError, match="mapping") as info:
        load_hardware(str(path))
    assert str(path) in str(info.value)


def test_missing_file_is_an_advisor_error(tmp_path):
    with pytest.raises(AdvisorError, match="not found"):
        load_hardware(str(tmp_path / "nope.yaml"))


def test_unknown_bundled_name_lists_the_bundled_ones():
    with pytest.raises(AdvisorError, match="dgx-h100"):
        load_hardware("no-such-machine")


def test_unknown_top_level_key(tmp_path):
    data = _raw("dgx-a100-80g")
    data["gpus_per_node"] = 8
    _expect_error(tmp_path, data, "gpus_per_node")


def test_unknown_nested_key(tmp_path):
    data = _raw("dgx-a100-80g")
    data["node"]["intra_node"]["bandwith_gbps"] = 300   # typo
    _expect_error(tmp_path, data, "intra_node", "bandwith_gbps")


def test_missing_top_level_key(tmp_path):
    data = _raw("dgx-a100-80g")
    del data["host"]
    _expect_error(tmp_path, data, "host")


def test_missing_nested_key(tmp_path):
    data = _raw("dgx-h100")
    del data["inter_node"]["latency_us"]
    _expect_error(tmp_path, data, "inter_node", "latency_us")


def test_missing_cross_group_key_for_mesh_groups(tmp_path):
    data = _raw("ascend-910")
    del data["node"]["intra_node"]["cross_group_bandwidth_gbps"]
    _expect_error(tmp_path, data, "cross_group_bandwidth_gbps")


@pytest.mark.parametrize(
    "section, key",
    [
        (("inter_node",), "bandwidth_gbps"),
        (("node", "intra_node"), "bandwidth_gbps"),
        (("node", "intra_node"), "cross_group_bandwidth_gbps"),
        (("device",), "memory_bandwidth_gbps"),
        (("host",), "pcie_bandwidth_gbps"),
    ],
)
def test_negative_bandwidth(tmp_path, section, key):
    data = _raw("ascend-910")
    target = data
    for part in section:
        target = target[part]
    target[key] = -10
    _expect_error(tmp_path, data, key, "positive")


@pytest.mark.parametrize(
    "section, key",
    [
        (("node", "intra_node"), "efficiency"),
        (("node", "intra_node"), "cross_group_efficiency"),
        (("inter_node",), "efficiency"),
        (("device",), "memory_efficiency"),
    ],
)
def test_efficiency_above_one(tmp_path, section, key):
    data = _raw("ascend-910")
    target = data
    for part in section:
        target = target[part]
    target[key] = 1.2
    _expect_error(tmp_path, data, key, "fraction")


def test_matmul_efficiency_above_one(tmp_path):
    data = _raw("dgx-a100-80g")
    data["device"]["matmul_efficiency"][-1] = [1000, 1.5]
    _expect_error(tmp_path, data, "matmul_efficiency")


def test_matmul_efficiency_not_ascending(tmp_path):
    data = _raw("dgx-a100-80g")
    data["device"]["matmul_efficiency"] = [[10, 0.5], [1, 0.3]]
    _expect_error(tmp_path, data, "matmul_efficiency", "increasing")


def test_group_size_must_divide_devices_per_node(tmp_path):
    data = _raw("ascend-910")
    data["node"]["intra_node"]["group_size"] = 3
    _expect_error(tmp_path, data, "group_size", "devices_per_node")


def test_unknown_dtype(tmp_path):
    data = _raw("dgx-h100")
    data["device"]["peak_tflops"]["fp4"] = 4000
    _expect_error(tmp_path, data, "fp4")


def test_unknown_topology(tmp_path):
    data = _raw("dgx-h100")
    data["node"]["intra_node"]["topology"] = "torus"
    _expect_error(tmp_path, data, "topology", "torus")


def test_oversubscription_below_one(tmp_path):
    data = _raw("dgx-h100")
    data["inter_node"]["oversubscription"] = 0.5
    _expect_error(tmp_path, data, "oversubscription")


def test_hardware_from_dict_uses_origin_in_messages():
    data = _raw("dgx-h100")
    data["inter_node"]["bandwidth_gbps"] = 0
    with pytest.raises(AdvisorError, match=r"^my-origin: inter_node: key 'bandwidth_gbps'"):
        hardware_from_dict(data, "my-origin")


# ---------------------------------------------------------------- measured extensions (advisor calibrate)


def test_measured_per_operation_links_and_pipeline_overheads_load(tmp_path):
    data = _raw("dgx-a100-80g")
    data["node"]["intra_node"]["collectives"] = {"all_reduce": {"latency_us": 40.0, "bandwidth_gbps": 200.0},
                                                 "p2p": {"latency_us": 5.0, "bandwidth_gbps": 250.0}}
    data["device"]["pipeline_action_overhead_us"] = {"1f1b": 120.0, "interleaved-1f1b": 300.0}
    data["device"]["optimizer_bytes_per_param"] = 60.0
    hw = load_hardware(str(_write(tmp_path, data)))
    assert hw.node.intra.for_op("all_reduce").latency_us == 40.0
    assert hw.node.intra.for_op("all_gather") is hw.node.intra
    assert hw.device.action_overhead_us("interleaved-1f1b") == 300.0 and hw.device.action_overhead_us("gpipe") == 0.0
    assert hw.device.optimizer_bytes_per_param == 60.0
    # a what-if on the link's bandwidth drops the fits measured for the old link
    what_if = hw.with_overrides(intra_node_gbps=100.0)
    assert what_if.node.intra.per_op == () and "collectives" not in what_if.raw["node"]["intra_node"]


@pytest.mark.parametrize("where, value, words", [
    ("collectives", {"broadcast": {"latency_us": 1.0, "bandwidth_gbps": 1.0}}, "unknown operation 'broadcast'"),
    ("collectives", {"p2p": {"latency_us": -1.0, "bandwidth_gbps": 1.0}}, "'latency_us' must be a positive number"),
    ("collectives", [1, 2], "expected a mapping"),
    ("pipeline_action_overhead_us", {"zero-bubble": 1.0}, "unknown pipeline schedule 'zero-bubble'"),
    ("pipeline_action_overhead_us", {"1f1b": "fast"}, "'1f1b' must be a non-negative number"),
])
def test_bad_measured_extensions_name_the_key(tmp_path, where, value, words):
    data = _raw("dgx-a100-80g")
    if where == "collectives":
        data["node"]["intra_node"][where] = value
    else:
        data["device"][where] = value
    with pytest.raises(AdvisorError, match=words):
        load_hardware(str(_write(tmp_path, data)))
