"""Launch configurations people already have, read as the settings advisor prices (``--from FILE``).

One module per format; each reads a file's text into an ``Imported``: the training-job and strategy
settings by field name (advisor.specs.job.TrainingJob, advisor.space.strategy.Strategy), the cluster size
the launcher gives, and the model shape the file states (checked against ``--model``). Every key is either
read, listed as price-neutral with its reason (learning rates, paths, logging), or refused naming the file,
the key and the value: a key that would change the price is never skipped silently.

Formats (``read_launch_config`` picks by the file's content):

* ``megatron``   a Megatron-LM argument list or launch script (pretrain_gpt.py flags, torchrun's node counts),
  as ``advisor export --to megatron`` writes it (advisor.importers.megatron_args)
* ``deepspeed``  a DeepSpeed ds_config.json, or the launch script naming it (advisor.importers.deepspeed_config)
* ``torchtitan`` a torchtitan job TOML (advisor.importers.torchtitan_toml)
* ``mindspore``  a MindFormers training YAML (advisor.importers.mindformers_yaml)
* ``megatron``   a Megatron-Bridge ConfigContainer YAML: the run_config.yaml it writes with every checkpoint, or a
  recipe's config as ConfigContainer.to_yaml() prints it (advisor.importers.megatron_bridge)
* ``megatron``   a NeMo 2 recipe as YAML (``nemo llm pretrain --factory ... --to-yaml``; advisor.importers.nemo2_yaml)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.importers.imported import Imported, read_text, where
from advisor.space.strategy import DEFAULT_MESH_ORDER, Strategy, even_stage_layers
from advisor.specs.setting import field_default, settings_of


def read_launch_config(path: str | Path) -> Imported:
    """The settings of one launch configuration file, its format picked by its name and content."""
    text = read_text(path)
    name = str(path)
    if name.endswith(".json"):
        from advisor.importers.deepspeed_config import read_ds_config

        return read_ds_config(text, name)
    if "--deepspeed_config" in text or "--deepspeed-config" in text:
        from advisor.importers.deepspeed_config import read_deepspeed_launch

        return read_deepspeed_launch(text, name)
    if name.endswith((".yaml", ".yml")):
        from advisor.importers.megatron_bridge import is_bridge_config, read_bridge
        from advisor.importers.mindformers_yaml import read_mindformers
        from advisor.specs.untrusted import parse

        from advisor.importers.nemo2_yaml import is_nemo2_config, read_nemo2

        doc = parse(text, where(name), "yaml")
        if is_nemo2_config(doc):
            return read_nemo2(text, name)
        if is_bridge_config(doc):
            return read_bridge(text, name)

        return read_mindformers(text, name)
    if name.endswith(".toml"):
        from advisor.importers.torchtitan_toml import read_torchtitan

        return read_torchtitan(text, name)
    if "pretrain_gpt.py" in text or text.lstrip().startswith("--") or "--tensor-model-parallel-size" in text:
        from advisor.importers.megatron_args import read_megatron

        return read_megatron(text, name)
    raise AdvisorError(f"{where(name)}: none of a Megatron-LM argument list or launch script (pretrain_gpt.py "
                       "flags), a DeepSpeed config (.json) or launch script (--deepspeed_config), a torchtitan job "
                       "TOML (.toml), a MindFormers YAML, a Megatron-Bridge ConfigContainer YAML or a NeMo 2 recipe YAML (.yaml)")


def pins_of(imported: Imported, strategy: dict[str, Any], searched: set[str], num_layers: int) -> dict[str, Any]:
    """The settings ``recommend --from`` pins (those the search explores). What the search would choose the same
    way (an even split of the layers, the default rank order) is dropped; any other setting the search cannot pin
    (uneven stage layers, recomputed-layer counts, a bucket size) is refused, pointing at ``estimate --from``."""
    rest = dict(strategy)
    if tuple(rest.get("stage_layers") or ()) in ((), even_stage_layers(num_layers, rest.get("pp", 1))):
        rest.pop("stage_layers", None)
    if tuple(rest.get("mesh_order") or DEFAULT_MESH_ORDER) == DEFAULT_MESH_ORDER:
        rest.pop("mesh_order", None)
    defaults = {fl.name: field_default(fl) for fl, _ in settings_of(Strategy)}
    fixed = sorted(k for k in set(rest) - searched if rest[k] != defaults.get(k))
    if fixed:
        raise AdvisorError(f"{where(imported.source)}: recommend pins the searched settings only, and the file also "
                           f"fixes {', '.join(fixed)}; price it with advisor estimate --from")
    return {k: v for k, v in rest.items() if k in searched}


def _layer_patterns(model) -> dict[str, Any]:
    """What the model gives for the layer patterns a launch states (Megatron's --moe-layer-freq, 1: an MoE layer,
    and --window-attn-skip-freq, 1: a windowed layer): the MoE layers by index, the windowed share."""
    layers = model.num_layers
    return {"moe_layer_pattern": None if model.moe is None else [int(model.is_moe_layer(i)) for i in range(layers)],
            "window_pattern": None if model.sliding_window is None else 1.0 / model.sliding_window_every}


def _as_stated(key: str, value: Any, layers: int) -> Any:
    """A launch's layer pattern as _layer_patterns gives the model's: an integer N expanded as Megatron reads it
    (MoE at 0, N, 2N...; N-1 windowed layers then a full one), a window pattern as its windowed share."""
    if key == "moe_layer_pattern" and isinstance(value, int):
        return [int(i % max(value, 1) == 0) for i in range(layers)]
    if key == "window_pattern":
        if value is None:
            return 1.0                               # every layer windowed
        pattern = [int(i % value != value - 1) for i in range(layers)] if isinstance(value, int) else value
        return sum(pattern) / max(len(pattern), 1)
    return value


def check_model(imported: Imported, model) -> None:
    """Refuse a file whose model shape differs from the model being priced, naming the key and both values."""
    patterns = _layer_patterns(model)
    for key, value in imported.model.items():
        if key == "moe":
            have = None if model.moe is None else {k: getattr(model.moe, k) for k in value}
        elif key == "mla":
            have = None if model.mla is None else {k: getattr(model.mla, k) for k in (value or {})}
        elif key in patterns:
            value, have = _as_stated(key, value, model.num_layers), patterns[key]
            if have is None and key == "moe_layer_pattern":
                continue                             # Megatron reads the MoE pattern only with experts
        else:
            have = getattr(model, key)
        if have != value:
            raise AdvisorError(f"{where(imported.source)}: it gives {key} = {value}, but --model {model.name} "
                               f"has {have}; give the matching --model")


def strategy_settings(imported: Imported, num_layers: int, grad_reduce_bytes: float) -> dict[str, Any]:
    """The Strategy settings (by field name) of an import, with what needs the model resolved: virtual stages from
    layers per chunk, per-stage layers from a layout or first/last counts, recomputed layers from a per-chunk
    count, the gradient bucket from its parameter count."""
    s = dict(imported.strategy)
    pp = s.get("pp", 1)
    per_chunk = s.pop("layers_per_chunk", None)
    layout = s.pop("layout", None)
    first, last = s.pop("first_stage_layers", None), s.pop("last_stage_layers", None)
    embedding, loss = s.pop("account_embedding", False), s.pop("account_loss", False)
    recompute_per_chunk = s.pop("recompute_layers_per_chunk", None)
    bucket = s.pop("bucket_params", None)
    local = s.pop("local_batch_size", None)
    parts = s.pop("model_parts", None)
    here = where(imported.source)
    if per_chunk is not None:
        total = num_layers + embedding + loss
        if per_chunk < 1 or total % (pp * per_chunk):
            raise AdvisorError(f"{here}: --num-layers-per-virtual-pipeline-stage {per_chunk} does not divide the "
                               f"{total} layers per pipeline stage of pp {pp}")
        s["virtual_pipeline_stages"] = total // (pp * per_chunk)
    if layout is not None:
        if len(layout) % pp:
            raise AdvisorError(f"{here}: the pipeline layout has {len(layout)} parts, not a multiple of pp = {pp}")
        s["virtual_pipeline_stages"] = len(layout) // pp
        s["stage_layers"] = tuple(sum(layout[v * pp + p] for v in range(len(layout) // pp)) for p in range(pp))
    elif first is not None or last is not None or embedding or loss:
        s["stage_layers"] = _uneven(num_layers, pp, first, last, embedding, loss, here)
    if parts is not None:            # torchtitan's module_fqns_per_model_part: part v x pp + p runs on rank p
        if not isinstance(parts, list) or len(parts) % pp or not all(isinstance(x, list) for x in parts):
            raise AdvisorError(f"{here}: module_fqns_per_model_part must list pp x virtual stages parts, got "
                               f"{len(parts) if isinstance(parts, list) else type(parts).__name__} for pp = {pp}")
        counts = [sum(1 for name in part if str(name).startswith("layers.")) for part in parts]
        s["virtual_pipeline_stages"] = len(parts) // pp
        s["stage_layers"] = tuple(sum(counts[v * pp + p] for v in range(len(parts) // pp)) for p in range(pp))
    if local is not None:            # torchtitan's per-rank batch: the micro-batch without pipelining
        if pp == 1:
            s["micro_batch_size"] = local
        elif local % s.get("micro_batch_size", 1):
            raise AdvisorError(f"{here}: local_batch_size {local} is not a multiple of the pipeline micro-batch "
                               f"{s.get('micro_batch_size', 1)}")
    if recompute_per_chunk is not None:
        s["recompute_layers"] = recompute_per_chunk * s.get("virtual_pipeline_stages", 1)
    if bucket is not None:
        s["grad_bucket_mb"] = bucket * grad_reduce_bytes / 2 ** 20
    if s.get("virtual_pipeline_stages", 1) > 1:
        s.setdefault("pipeline_schedule", "interleaved-1f1b")
    return s


def _uneven(layers: int, pp: int, first, last, embedding: bool, loss: bool, here: str) -> tuple[int, ...]:
    """Megatron's uneven split: the first and last stages' counts given (the rest even), or the embedding and
    the loss counted as a layer each (transformer_config.py, core_v0.13-0.15)."""
    if first is not None or last is not None:
        middle = layers - (first or 0) - (last or 0)
        inner = pp - (first is not None) - (last is not None)
        if inner < 0 or middle < 0 or (inner and middle % inner) or (not inner and middle):
            raise AdvisorError(f"{here}: the first/last stage layers ({first}, {last}) do not leave an even split of "
                               f"the other {middle} layers over pp = {pp}")
        each = middle // inner if inner else 0
        return tuple([first if first is not None else each] + [each] * (pp - 2) + [last if last is not None else each])
    total = layers + embedding + loss
    if total % pp:
        raise AdvisorError(f"{here}: {total} layers (with the embedding and loss counted) do not split evenly over "
                           f"pp = {pp}")
    per = total // pp
    out = [per] * pp
    out[0] -= embedding
    out[-1] -= loss
    return tuple(out)
