"""Generate ``plan.schema.json`` from the settings' records: ``python -m advisor.schemas.generate``.

The plan's ``training`` and ``parallel`` blocks are written and read from the Setting record of every
field of TrainingJob and Strategy (advisor.plan_codec); their schema comes from the same records: the
kind gives the JSON type and bounds, ``optional`` allows null, ``required`` makes the key required,
``doc`` is the description. Settings with a reader of their own (``custom`` kind, or a ``read``) are
described in CUSTOM, and the keys the model families add to the parallel block in PARALLEL_EXTRA; a new
one of either fails the generation until it is described here. tests/test_json_schemas.py checks that
the file is what this module writes now.
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from advisor.schemas import schema_id

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = Path(__file__).with_name("plan.schema.json")


def _int(minimum: int, maximum: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _custom() -> dict[str, dict[str, Any]]:
    """The settings with a plan reader of their own (advisor.space.strategy), as their readers accept them."""
    from advisor.space.strategy import MESH_DIMS
    from advisor.specs import limits

    return {
        "recompute_layers": {"anyOf": [
            {"type": "null"},
            _int(1, limits.MAX_LAYERS),
            {"type": "array", "minItems": 1, "items": _int(0)},
        ]},
        "stage_layers": {"type": "array", "minItems": 1, "items": _int(1)},
        "mesh_order": {"type": "array", "items": {"enum": list(MESH_DIMS)}, "minItems": len(MESH_DIMS),
                       "maxItems": len(MESH_DIMS), "uniqueItems": True},
        "swap_layers": {"type": ["array", "null"], "minItems": 1, "items": _int(0, limits.MAX_LAYERS)},
    }


def _kind_schema(name: str, s) -> dict[str, Any]:
    """The JSON Schema of a setting's value (advisor.specs.setting.Setting.check and read_plan)."""
    from advisor.specs import limits

    kind = s.kind
    if kind in ("positive_int", "non_negative_int"):
        return _int(1 if kind == "positive_int" else 0, int(s.maximum) if s.maximum is not None else limits.MAX_INT)
    if kind in ("positive_float", "non_negative_float", "fraction"):
        # the plan reader's bounds (advisor.specs._fields) and the setting's own (Setting.check)
        low = 0.0 if kind == "non_negative_float" else limits.MIN_POSITIVE
        if s.minimum is not None:
            low = max(low, float(s.minimum))
        bound = float(s.maximum) if s.maximum is not None else limits.MAX_QUANTITY
        high = min(1.0, bound) if kind == "fraction" else bound
        return {"type": "number", "minimum": low, "maximum": high}
    if kind == "choice":
        return {"enum": list(s.choices)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "names":
        return {"type": "array", "items": {"enum": list(s.choices)}, "uniqueItems": True}
    if kind == "text":
        return {"type": "string"}
    raise ValueError(f"setting {name!r}: kind {kind!r} has no JSON Schema in advisor/schemas/generate.py")


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _default(fl, s) -> Any:
    from advisor.specs.setting import field_default

    value = field_default(fl)
    if value is MISSING or value is None:      # None: the writer may not take it (swap_layers' is list)
        return value
    return s.write_plan(value)


def setting_schema(fl, s, custom: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One plan key's schema: its value's, its doc as the description, its default."""
    if s.read is not None or s.kind == "custom":
        if fl.name not in custom:
            raise ValueError(f"setting {fl.name!r} has a plan reader of its own: describe its JSON in "
                             "advisor/schemas/generate.py (_custom)")
        value = dict(custom[fl.name])
    else:
        value = _kind_schema(fl.name, s)
        if s.optional:
            value = _nullable(value)
    out = {"description": " ".join(s.doc.split()), **value}
    default = _default(fl, s)
    if default is not MISSING:
        out["default"] = default
    return out


def block_schema(cls, title: str, description: str, extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The schema of a plan block written from a config dataclass (advisor.plan_codec.block_to_dict),
    with ``extra`` keys beside the settings'."""
    from advisor.plan_codec import block_keys
    from advisor.specs.setting import settings_of

    custom = _custom()
    required, optional = block_keys(cls)
    written = set(required) | set(optional)
    props = {fl.name: setting_schema(fl, s, custom) for fl, s in settings_of(cls) if fl.name in written}
    clash = sorted(set(props) & set(extra))
    if clash:
        raise ValueError(f"{cls.__name__}: key {clash[0]!r} is both a setting and an extra key")
    return {"title": title, "description": description, "type": "object", "required": list(required),
            "additionalProperties": False, "properties": {**props, **extra}}


def _target() -> dict[str, Any]:
    from advisor.specs import limits

    number = {"type": "number", "minimum": limits.MIN_POSITIVE, "maximum": limits.MAX_QUANTITY}
    return {"description": "What --objective time-to-target aimed at (advisor.cost.convergence.Target); absent "
                           "for other objectives.",
            "type": ["object", "null"], "additionalProperties": False,
            "properties": {"tokens": {**number, "description": "Tokens to the target at a small batch."},
                           "loss": {**number, "description": "The target loss (nats per token)."},
                           "critical_batch_tokens": {**number, "description": "The critical batch in tokens."}}}


def parallel_extra() -> dict[str, dict[str, Any]]:
    """The keys the model families add to the parallel block (advisor.plan._PARALLEL_EXTRA), loosely."""
    from advisor.plan import _PARALLEL_EXTRA
    from advisor.plan_ps import EMBEDDING_PLACEMENTS, PLACEMENTS, PS_MODES, REPLICAS

    names = {"type": "array", "minItems": 1, "items": {"type": "string"}}
    extra = {
        "parameter_server": {
            "description": "Recommendation models (advisor.plan_ps): the parameter servers, or null for none.",
            "type": ["object", "null"], "additionalProperties": False,
            "properties": {"mode": {"enum": list(PS_MODES)}, "synchronous": {"type": "boolean"},
                           "servers": _int(1), "server_placement": {"enum": list(PLACEMENTS)},
                           "tensors": names,
                           "sharding": {"type": "object", "additionalProperties": {
                               "type": "array", "minItems": 1, "items": _int(0)}},
                           "replicas": {"enum": list(REPLICAS)}}},
        "embedding_placement": {
            "description": "Recommendation models (advisor.plan_ps): where the embedding tables live.",
            "enum": [*EMBEDDING_PLACEMENTS, None]},
        "host_tables": {
            "description": "Recommendation models with embedding_placement host: the tables in host memory "
                           "(absent or null: all).",
            "type": ["array", "null"], "items": {"type": "string"}},
        "stage_devices": {
            "description": "Mixed clusters (advisor.plan_mixed): the hardware profile of each pipeline stage.",
            **names},
        "replica_devices": {
            "description": "Mixed clusters (advisor.plan_mixed): the hardware profile of each data-parallel replica.",
            **names},
        "dp_batch_split": {
            "description": "Mixed clusters (advisor.plan_mixed): each replica's share of the global batch.",
            "type": "array", "minItems": 1, "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        "supernet": {
            "description": "Supernets (advisor.plan_supernet): how subnets are sampled and run (NASPipe).",
            "type": ["object", "null"], "additionalProperties": False,
            "properties": {"subnets": _int(1), "seed": _int(0), "train_shared": {"type": "boolean"},
                           "window": {"anyOf": [_int(1), {"type": "null"}]},
                           "context_switch": {"type": "boolean"}, "checkpoint": {"type": "boolean"}}},
    }
    if set(extra) != set(_PARALLEL_EXTRA):
        raise ValueError(f"advisor.plan._PARALLEL_EXTRA is {sorted(_PARALLEL_EXTRA)}; advisor/schemas/generate.py "
                         f"describes {sorted(extra)}")
    return {k: extra[k] for k in _PARALLEL_EXTRA}


def _prediction() -> dict[str, Any]:
    from advisor.plan import _PREDICTION_NUMBERS, _PREDICTION_PARTS, BAND_PAIRS

    props: dict[str, Any] = {k: {"type": ["number", "null"]} for k in _PREDICTION_NUMBERS}
    for k in _PREDICTION_PARTS:
        props[k] = {"type": ["object", "null"], "additionalProperties": {"type": "number"}}
    props["bottleneck"] = {"type": ["string", "null"]}
    props["confidence"] = {"type": ["object", "null"], "required": ["calibrated"],
                           "properties": {"calibrated": {"type": "boolean"},
                                          "extrapolated": {"type": "array", "items": {"type": "string"}}}}
    pair = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
    props["band"] = {"type": ["object", "null"],
                     "description": "The measured figures the error band expects, each [low, high] "
                                    "(advisor.cost.band)",
                     "properties": {**{k: pair for k in BAND_PAIRS}, "parts_outside": {"type": "integer", "minimum": 0},
                                    "basis": {"type": "string"}}}
    return {"title": "prediction",
            "description": "What the cost model predicts for the plan (advisor.plan.check_prediction); keys other "
                           "than these are the family's own figures.",
            "type": ["object", "null"], "properties": props}


def _search() -> dict[str, Any]:
    from advisor.plan import _SEARCH_COUNTS

    props: dict[str, Any] = {"searcher": {"type": ["string", "null"]}}
    props.update({k: {"type": ["integer", "null"], "minimum": 0} for k in _SEARCH_COUNTS})
    props["seconds"] = {"type": ["number", "null"]}
    return {"title": "search", "description": "How the plan was found (advisor.plan.check_search).",
            "type": ["object", "null"], "properties": props}


def plan_schema() -> dict[str, Any]:
    """The plan JSON's schema (advisor.plan.plan_to_dict, schema_version 1)."""
    from advisor.plan import SCHEMA_VERSION, _TOP_OPTIONAL, _TOP_REQUIRED
    from advisor.space.strategy import Strategy
    from advisor.specs import limits
    from advisor.specs.job import TrainingJob
    from advisor.specs.mixed import MAX_PARTS

    devices = _int(1, limits.MAX_DEVICES)
    props: dict[str, Any] = {
        "schema_version": {"description": "The plan format's version.", "const": SCHEMA_VERSION},
        "advisor_version": {"description": "The advisor release that wrote the plan.", "type": "string"},
        "model": {"description": "The model description the plan was made from, verbatim (models/*.yaml).",
                  "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        "hardware": {"description": "The hardware profile the plan was made from, verbatim (hardware_profiles/*.yaml), "
                                    "or for a mixed cluster a list of its parts: {profile, nodes}.",
                     "oneOf": [
                         {"$ref": "#/$defs/hardware_profile"},
                         {"type": "array", "minItems": 2, "maxItems": MAX_PARTS,
                          "items": {"type": "object", "required": ["profile", "nodes"], "additionalProperties": False,
                                    "properties": {"profile": {"$ref": "#/$defs/hardware_profile"},
                                                   "nodes": devices}}}]},
        "cluster": {"description": "The cluster size.", "type": "object", "required": ["nodes", "devices"],
                    "additionalProperties": False, "properties": {"nodes": devices, "devices": devices}},
        "training": {"$ref": "#/$defs/training"},
        "parallel": {"$ref": "#/$defs/parallel"},
        "operator_strategies": {"description": "Per-operator sharding the plan fixes (--operator-strategies), or null."},
        "prediction": {"$ref": "#/$defs/prediction"},
        "search": {"$ref": "#/$defs/search"},
    }
    if set(props) != set(_TOP_REQUIRED) | set(_TOP_OPTIONAL):
        raise ValueError(f"advisor.plan's top-level keys are {sorted({*_TOP_REQUIRED, *_TOP_OPTIONAL})}; "
                         f"advisor/schemas/generate.py describes {sorted(props)}")
    training = block_schema(TrainingJob, "training", "What is trained and how the framework runs it: one key per "
                            "setting of advisor.specs.job.TrainingJob (advisor.plan_codec), and the objective's target.",
                            {"target": _target()})
    parallel = block_schema(Strategy, "parallel", "How the model is parallelised: one key per setting of "
                            "advisor.space.strategy.Strategy (advisor.plan_codec), and the keys the model families add.",
                            parallel_extra())
    return {
        "$schema": DRAFT,
        "$id": schema_id("plan"),
        "$comment": "Generated by python -m advisor.schemas.generate from the settings' records; do not edit.",
        "title": "advisor plan",
        "description": f"The plan JSON written by advisor recommend --out (schema_version {SCHEMA_VERSION}; "
                       "advisor.plan.plan_to_dict) and read by estimate --plan, export and execute.",
        "type": "object",
        "required": list(_TOP_REQUIRED),
        "additionalProperties": False,
        "properties": props,
        "$defs": {
            "training": training,
            "parallel": parallel,
            "hardware_profile": {
                "title": "hardware profile", "description": "A hardware profile mapping (advisor.specs.hardware).",
                "type": "object", "required": ["name", "source", "device", "node", "inter_node", "host"],
                "properties": {"name": {"type": "string"}, "source": {"type": "string"},
                               "device": {"type": "object"}, "node": {"type": "object"},
                               "inter_node": {"type": "object"}, "host": {"type": "object"}}},
            "prediction": _prediction(),
            "search": _search(),
        },
    }


def render() -> str:
    """The text of plan.schema.json."""
    return json.dumps(plan_schema(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """(Re)write advisor/schemas/plan.schema.json; ``--check``: exit 1 if it is not what would be written."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--check"]:
        current = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.is_file() else ""
        if current != text:
            print(f"{SCHEMA_FILE} is out of date: run python -m advisor.schemas.generate", file=sys.stderr)
            return 1
        return 0
    if args:
        print("usage: python -m advisor.schemas.generate [--check]", file=sys.stderr)
        return 2
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
