"""The model as a Hugging Face config.json (advisor.export.hf_model), which the DeepSpeed export writes.

Each written config is read back by advisor's own reader (advisor.specs.hf_config) and, where
transformers is installed (CI installs it), built by transformers on the meta device: the model it
builds has the priced parameter count (up to the small parts advisor's description does not count:
Qwen3's QK-norm, gpt-oss's attention sinks and router biases), the priced heads and widths, and the
priced windowed layers.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.commands.estimate_request import estimate_request
from advisor.export import export_plan
from advisor.export.hf_model import FILE, hf_model
from advisor.specs.blocks import MoESpec
from advisor.specs.model import bundled_models, load_model

TRANSFORMERS = [n for n in bundled_models("transformer")]
# parts of transformers' models advisor's descriptions do not count (advisor.specs.hf_config notes each)
UNCOUNTED = 1e-4


def _model_type(name: str) -> str | None:
    return hf_model(load_model(name)).model_type


def test_every_bundled_decoder_has_a_family_that_reads_back():
    families = {n: _model_type(n) for n in TRANSFORMERS}
    no_family = sorted(n for n, t in families.items() if t is None)
    # BERT is an encoder; BLOOM's ALiBi positions have no reader (advisor.specs.hf_config)
    assert no_family == ["bert-large", "bloom-176b"]
    assert families["deepseek-v3"] == "deepseek_v3"
    assert families["qwen3-30b-a3b"] == "qwen3_moe"
    assert families["gpt-oss-120b"] == "gpt_oss"
    assert families["mixtral-8x7b"] == "mixtral"
    assert families["llama3-70b"] == "llama"
    assert families["gpt3-175b"] == "gpt2"
    assert "encoder" in hf_model(load_model("bert-large")).why


def _variant(**changes):
    return replace(load_model("llama3-8b"), **changes)


@pytest.mark.parametrize("changes, family", [
    ({"head_dim_override": 256}, "llama"),
    ({"sliding_window": 4096, "sliding_window_every": 1}, "mistral"),
    ({"sliding_window": 4096, "sliding_window_every": 4}, "qwen3"),
    ({"moe": MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=14336)}, "mixtral"),
    ({"moe": MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=2048, first_k_dense_layers=2)}, "qwen3_moe"),
    ({"moe": MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=14336, layer_frequency=2)}, "qwen3_moe"),
])
def test_variants_pick_the_family_that_expresses_them(changes, family):
    result = hf_model(_variant(**changes))
    assert result.model_type == family, result.why


@pytest.mark.parametrize("changes, why", [
    ({"moe": MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=2048, num_shared_experts=1)}, "shared experts"),
    ({"use_bias": True, "sliding_window": 4096}, "biases"),
    ({"norm": "layernorm"}, "no family pairs"),
])
def test_what_no_family_builds_is_refused_with_the_reason(changes, why):
    result = hf_model(_variant(**changes))
    assert result.config is None and why in result.why


def _sliding_layers(cfg) -> int:
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        return sum(t == "sliding_attention" for t in types)
    return cfg.num_hidden_layers if getattr(cfg, "sliding_window", None) else 0


@pytest.mark.parametrize("name", [n for n in TRANSFORMERS if n not in ("bert-large", "bloom-176b")])
def test_transformers_builds_the_priced_model(name):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model = load_model(name)
    config = hf_model(model).config
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    assert type(cfg).__name__.lower().startswith(config["model_type"].replace("_", "")), type(cfg).__name__
    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    assert type(net).__name__ == config["architectures"][0]
    built = sum(p.numel() for p in net.parameters())
    assert 0 <= built - model.num_params <= UNCOUNTED * model.num_params, (built, model.num_params)
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    assert layers == model.num_layers
    if model.mla is None and hasattr(cfg, "num_key_value_heads"):
        assert cfg.num_key_value_heads == model.num_kv_heads
        assert (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads) == model.head_dim
    windowed = 0 if model.sliding_window is None else model.num_layers // model.sliding_window_every
    assert _sliding_layers(cfg) == windowed
    if windowed:
        assert cfg.sliding_window == model.sliding_window


@pytest.mark.parametrize("name, hardware, devices", [("qwen3-30b-a3b", "dgx-h100", 32), ("deepseek-v3", "dgx-h100", 256),
                                                     ("llama3-8b", "dgx-h100", 8)])
def test_deepspeed_export_writes_the_model_and_reads_back_at_the_price(tmp_path: Path, name, hardware, devices):
    from advisor.commands.inputs import resolve_inputs
    from advisor.commands.recommend import recommend
    from advisor.search import Pins

    i = resolve_inputs(name, hardware, devices=devices, framework="deepspeed")
    plan = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=1).plans[0]
    result = export_plan(plan, "deepspeed")
    assert not result.unsupported, result.unsupported
    assert FILE in result.files and any(FILE in n for n in result.notes)
    for file, text in result.files.items():
        (tmp_path / file).write_text(text)
    assert json.loads(result.files[FILE]) == hf_model(plan.model).config
    # the exported files alone: the architecture from config.json, the layout from the launcher and ds_config
    back = estimate_request(str(tmp_path / FILE), hardware, None, devices, job={}, strategy={},
                            launch=str(tmp_path / "launch_deepspeed.sh"))
    assert back.estimate.tokens_per_s == pytest.approx(plan.prediction["tokens_per_s"], rel=1e-9)
    assert back.estimate.memory_gib.total == pytest.approx(plan.prediction["memory_gib"]["total"], rel=1e-9)
