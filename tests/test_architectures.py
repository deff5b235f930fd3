"""Kernels and number formats a device cannot run are refused with the reason (#33), from the device's
architecture (advisor/specs/architectures.py): fused attention before Ampere, MXFP8 before Blackwell."""

from __future__ import annotations

import pytest

from advisor.commands.inputs import resolve_inputs
from advisor.errors import AdvisorError
from advisor.specs.architectures import ARCHITECTURES
from advisor.specs.hardware import hardware_from_dict, load_hardware

BUNDLED = ("ascend-910", "ascend-910b", "dgx-a100-40g", "dgx-a100-80g", "dgx-b200", "dgx-b300", "dgx-h100", "dgx-h200",
           "dgx-v100", "gb200-nvl72", "gb300-nvl72")


def test_every_bundled_profile_names_its_architecture():
    assert {name: load_hardware(name).device.architecture for name in BUNDLED} == {
        "ascend-910": "davinci", "ascend-910b": "davinci", "dgx-a100-40g": "ampere", "dgx-a100-80g": "ampere",
        "dgx-b200": "blackwell", "dgx-b300": "blackwell-ultra", "dgx-h100": "hopper", "dgx-h200": "hopper",
        "dgx-v100": "volta", "gb200-nvl72": "blackwell", "gb300-nvl72": "blackwell-ultra"}


def test_flash_attention_on_volta_is_refused_and_math_is_the_default_there():
    with pytest.raises(AdvisorError, match=r"--attention flash: fused attention does not run on the V100-SXM3-32GB .*"
                                           r"use --attention math"):
        resolve_inputs("llama3-8b", "dgx-v100", nodes=1, attention="flash")
    assert resolve_inputs("llama3-8b", "dgx-v100", nodes=1).job.attention == "math"
    assert resolve_inputs("llama3-8b", "dgx-a100-80g", nodes=1).job.attention == "flash"


def test_mxfp8_runs_on_blackwell_only():
    with pytest.raises(AdvisorError, match=r"--fp8-recipe mxfp8: block-scaled FP8 runs on NVIDIA Blackwell .* H100"):
        resolve_inputs("llama3-8b", "dgx-h100", nodes=1, dtype="fp8", fp8_recipe="mxfp8")
    assert resolve_inputs("llama3-8b", "dgx-b200", nodes=1, dtype="fp8", fp8_recipe="mxfp8").job.recipe == "mxfp8"
    assert resolve_inputs("llama3-8b", "dgx-h100", nodes=1, dtype="fp8", fp8_recipe="blockwise").job.recipe == "blockwise"


def test_an_unknown_architecture_is_refused_naming_the_key():
    raw = dict(load_hardware("dgx-h100").raw)
    raw["device"] = {**raw["device"], "architecture": "pascal"}
    with pytest.raises(AdvisorError, match="architecture"):
        hardware_from_dict(raw, "my.yaml")
    assert set(ARCHITECTURES) >= {"volta", "ampere", "hopper", "blackwell", "davinci"}


@pytest.mark.parametrize("hardware, kernel", [("dgx-h100", "npu"), ("dgx-a100-80g", "npu"), ("ascend-910b", "te"),
                                              ("ascend-910b", "sdpa"), ("ascend-910b", "triton")])
def test_an_attention_kernel_the_device_does_not_run_is_refused(hardware, kernel):
    """Ascend's FlashAttentionScore runs on no NVIDIA GPU, the CUDA kernels on no Ascend NPU: a plan priced on one
    of them cannot run as priced."""
    with pytest.raises(AdvisorError, match=rf"--attention-kernel {kernel}: this attention kernel does not run on the "
                                           rf".* of profile '{hardware}' \(.* runs [a-z, ]+; advisor/specs/architectures.py\)"):
        resolve_inputs("llama3-8b", hardware, nodes=1, framework="pytorch", attention_kernel=kernel)


def test_each_architecture_runs_the_kernels_of_its_vendor():
    assert resolve_inputs("llama3-8b", "ascend-910b", nodes=1, framework="pytorch", attention_kernel="npu").job.kernel == "npu"
    for kernel in ("te", "sdpa", "triton"):
        assert resolve_inputs("llama3-8b", "dgx-h100", nodes=1, framework="pytorch", attention_kernel=kernel).job.kernel == kernel
    # the math attention needs no fused kernel: the given one is not checked against the device
    assert resolve_inputs("llama3-8b", "dgx-v100", nodes=1, framework="pytorch", attention_kernel="sdpa").job.attention == "math"
    assert ARCHITECTURES["volta"].attention_kernels == () and not ARCHITECTURES["volta"].flash_attention
    assert all(bool(a.attention_kernels) == a.flash_attention for a in ARCHITECTURES.values())


def test_a_framework_default_kernel_the_device_does_not_run_gives_way_to_the_framework_kernel_that_runs_there():
    """Megatron-LM's default (Transformer Engine) does not run on Ascend; there Megatron-LM runs through MindSpeed on
    FlashAttentionScore, and PyTorch through torch_npu: the job and the plan say npu, not te priced on npu's curve."""
    for framework in ("megatron", "pytorch"):
        job = resolve_inputs("llama3-8b", "ascend-910b", nodes=1, framework=framework).job
        assert (job.attention_kernel, job.kernel) == ("npu", "npu")
    assert resolve_inputs("llama3-8b", "dgx-h100", nodes=1, framework="megatron").job.attention_kernel is None
    assert resolve_inputs("llama3-8b", "ascend-910b", nodes=1, framework="mindspore").job.attention_kernel is None
    # a framework with no kernel the device runs keeps its default, priced on another curve with its note
    assert resolve_inputs("llama3-8b", "ascend-910b", nodes=1, framework="torchtitan").job.kernel == "sdpa"
