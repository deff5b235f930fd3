"""Generic operator graphs from JSON, for models outside the transformer family (CNNs, recommenders).

The format (one JSON object; see advisor/graph/README.md for the full description and
advisor/graph/examples/ for a CNN and a DLRM-style recommendation model)::

    {"name": "...", "source": "...", "dtype_bytes": 2,
     "tensors": {"x": {"shape": [64, 3, 224, 224]},
                 "w": {"shape": [64, 3, 7, 7], "param": true}, ...},
     "operators": [{"name": "conv1", "kind": "conv2d", "inputs": ["x", "w"], "outputs": ["y"]}, ...],
     "links": [{"from": "block_out", "to": "block_in", "count": 3}]}

Each operator's index labels are derived from its kind and shapes, or given as ``"einsum"``. Every
mistake raises AdvisorError naming the file, the key and the value.
"""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.graph.graph import GEMM_KINDS, KINDS, Link, Operator, OperatorGraph, Tensor
from advisor.specs.untrusted import load_tree

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
_TOP_REQUIRED = ("name", "tensors", "operators")
_TOP_OPTIONAL = ("source", "dtype_bytes", "links", "notes")
_TENSOR_KEYS = ("shape", "dtype_bytes", "param", "tied_to")
_OP_REQUIRED = ("name", "kind", "inputs", "outputs")
_OP_OPTIONAL = ("einsum", "flops", "no_cut", "stat_labels", "stat_bytes", "label_map", "saves", "count",
                "epilogue_passes", "axis", "notes")
_LINK_KEYS = ("from", "to", "count")
_FREE = "abcdefghijklmnopqrstuvwxyz"


def load_graph(path: str | Path) -> OperatorGraph:
    """A graph file by path, or a bundled example by name (advisor/graph/examples/NAME.json)."""
    p = Path(path)
    if not p.suffix and not p.exists() and (EXAMPLES_DIR / f"{p}.json").is_file():
        p = EXAMPLES_DIR / f"{p}.json"
    if not p.is_file():
        names = ", ".join(sorted(x.stem for x in EXAMPLES_DIR.glob("*.json")))
        raise AdvisorError(f"graph file not found: {path} (bundled examples: {names})")
    data = load_tree(p, "graph", fmt="json")   # bounded, UTF-8, finite, no control characters
    return graph_from_dict(data, str(p))


def bundled_graphs() -> list[str]:
    return sorted(x.stem for x in EXAMPLES_DIR.glob("*.json"))


# ---- small validators ---------------------------------------------------------------------------
def _keys(data: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    if not isinstance(data, dict):
        raise AdvisorError(f"{where}: expected an object, got {data!r}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise AdvisorError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(required + optional))})")
    missing = [k for k in required if k not in data]
    if missing:
        raise AdvisorError(f"{where}: missing required key '{missing[0]}'")


def _pos_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AdvisorError(f"{where}: key '{key}' must be a positive integer, got {value!r}")
    return value


def _pos_num(value: Any, where: str, key: str, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise AdvisorError(f"{where}: key '{key}' must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
    return float(value)


def _names(value: Any, where: str, key: str, known: dict[str, Tensor] | None = None, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value) or (not value and not allow_empty):
        raise AdvisorError(f"{where}: key '{key}' must be a list of names, got {value!r}")
    if known is not None:
        for x in value:
            if x not in known:
                raise AdvisorError(f"{where}: key '{key}' names unknown tensor '{x}'")
    return tuple(value)


# ---- the graph ----------------------------------------------------------------------------------
def graph_from_dict(data: dict[str, Any], origin: str) -> OperatorGraph:
    _keys(data, origin, _TOP_REQUIRED, _TOP_OPTIONAL)
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise AdvisorError(f"{origin}: key 'name' must be a non-empty string, got {name!r}")
    dtype = _pos_int(data.get("dtype_bytes", 2), origin, "dtype_bytes")
    tensors = _tensors(data["tensors"], origin, dtype)
    raw_ops = data["operators"]
    if not isinstance(raw_ops, list) or not raw_ops:
        raise AdvisorError(f"{origin}: key 'operators' must be a non-empty list, got {raw_ops!r}")
    ops = []
    produced: dict[str, str] = {}
    names: set[str] = set()
    for i, raw in enumerate(raw_ops):
        label = raw.get("name") if isinstance(raw, dict) else None
        where = f"{origin}: operators[{i}]" + (f" ('{label}')" if isinstance(label, str) else "")
        op = _operator(raw, where, tensors)
        if op.name in names:
            raise AdvisorError(f"{where}: key 'name' = '{op.name}' is used by another operator")
        names.add(op.name)
        for t in op.outputs:
            if t in produced:
                raise AdvisorError(f"{where}: key 'outputs' names '{t}', already produced by '{produced[t]}'")
            produced[t] = op.name
        ops.append(op)
    links = _links(data.get("links", []), origin, tensors, produced)
    try:
        return OperatorGraph(name=name, source=str(data.get("source", origin)), tensors=tensors,
                             operators=tuple(ops), links=links, notes=data.get("notes"))
    except AdvisorError as exc:
        raise AdvisorError(f"{origin}: {exc}") from None


def _tensors(raw: Any, origin: str, dtype: int) -> dict[str, Tensor]:
    if not isinstance(raw, dict) or not raw:
        raise AdvisorError(f"{origin}: key 'tensors' must map tensor names to {{\"shape\": [...]}}, got {raw!r}")
    out = {}
    for name, spec in raw.items():
        where = f"{origin}: tensors['{name}']"
        _keys(spec, where, ("shape",), _TENSOR_KEYS[1:])
        shape = spec["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise AdvisorError(f"{where}: key 'shape' must be a list of positive integers, got {shape!r}")
        param = spec.get("param", False)
        if not isinstance(param, bool):
            raise AdvisorError(f"{where}: key 'param' must be true or false, got {param!r}")
        tied = spec.get("tied_to")
        if tied is not None and (tied not in raw or not raw[tied].get("param", False) or not param):
            raise AdvisorError(f"{where}: key 'tied_to' must name another parameter (and this must be one), got {tied!r}")
        out[name] = Tensor(name, tuple(shape), _pos_int(spec.get("dtype_bytes", dtype), where, "dtype_bytes"), param, tied)
    return out


def _links(raw: Any, origin: str, tensors: dict[str, Tensor], produced: dict[str, str]) -> tuple[Link, ...]:
    if not isinstance(raw, list):
        raise AdvisorError(f"{origin}: key 'links' must be a list, got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        where = f"{origin}: links[{i}]"
        _keys(item, where, _LINK_KEYS)
        src, dst = item["from"], item["to"]
        for key, t in (("from", src), ("to", dst)):
            if t not in tensors:
                raise AdvisorError(f"{where}: key '{key}' names unknown tensor {t!r}")
        if src not in produced:
            raise AdvisorError(f"{where}: key 'from' = '{src}' is not produced by any operator")
        if tensors[src].shape != tensors[dst].shape:
            raise AdvisorError(f"{where}: key 'to' = '{dst}' has shape {list(tensors[dst].shape)}, "
                               f"but '{src}' has {list(tensors[src].shape)}")
        out.append(Link(src, dst, _pos_int(item["count"], where, "count")))
    return tuple(out)


def _operator(raw: Any, where: str, tensors: dict[str, Tensor]) -> Operator:
    _keys(raw, where, _OP_REQUIRED, _OP_OPTIONAL)
    name, kind = raw["name"], raw["kind"]
    if not isinstance(name, str) or not name:
        raise AdvisorError(f"{where}: key 'name' must be a non-empty string, got {name!r}")
    if kind not in KINDS:
        raise AdvisorError(f"{where}: key 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    inputs = _names(raw["inputs"], where, "inputs", tensors)
    outputs = _names(raw["outputs"], where, "outputs", tensors)
    for t in outputs:
        if tensors[t].param:
            raise AdvisorError(f"{where}: key 'outputs' names parameter '{t}'; an operator cannot produce a parameter")
    shapes = [tensors[t].shape for t in inputs + outputs]
    if "einsum" in raw:
        labels, no_cut = _parse_einsum(raw["einsum"], where, inputs, outputs, shapes)
        flops = _einsum_flops(labels, shapes) if kind in GEMM_KINDS else 0.0
    else:
        labels, no_cut, flops = _derive(kind, raw, where, inputs, outputs, tensors)
    extra_no_cut = frozenset(_names(raw.get("no_cut", []), where, "no_cut", allow_empty=True))
    stat = frozenset(_names(raw.get("stat_labels", []), where, "stat_labels", allow_empty=True))
    if kind == "loss" and "einsum" not in raw and "stat_labels" not in raw:
        stat = frozenset("v")
    label_map = raw.get("label_map", {})
    if not isinstance(label_map, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in label_map.items()):
        raise AdvisorError(f"{where}: key 'label_map' must map labels to labels, got {label_map!r}")
    used = {lab for labs in labels for lab in labs}
    for key, names in (("no_cut", extra_no_cut), ("stat_labels", stat), ("label_map", set(label_map) | set(label_map.values()))):
        for lab in names:
            if lab not in used:
                raise AdvisorError(f"{where}: key '{key}' names label '{lab}', which none of its tensors has "
                                   f"(labels: {''.join(sorted(used))})")
    saves = _names(raw["saves"], where, "saves", tensors, allow_empty=True) if "saves" in raw else \
        tuple(t for t in inputs if not tensors[t].param)
    for t in saves:
        if t not in inputs + outputs:
            raise AdvisorError(f"{where}: key 'saves' names '{t}', which is not one of its inputs or outputs")
    stat_default = 3.0 * 4 if kind == "loss" else 0.0
    return Operator(
        name=name, kind=kind, inputs=inputs, outputs=outputs, labels=tuple(tuple(x) for x in labels),
        flops=_pos_num(raw["flops"], where, "flops", allow_zero=True) if "flops" in raw else flops,
        epilogue_passes=_pos_num(raw.get("epilogue_passes", 0), where, "epilogue_passes", allow_zero=True),
        no_cut=frozenset(no_cut) | extra_no_cut, stat_labels=stat,
        stat_bytes=_pos_num(raw.get("stat_bytes", stat_default), where, "stat_bytes", allow_zero=True),
        label_map=tuple(label_map.items()), saves=saves, count=_pos_int(raw.get("count", 1), where, "count"),
    )


def _parse_einsum(spec: Any, where: str, inputs, outputs, shapes) -> tuple[list[str], set[str]]:
    if not isinstance(spec, str) or spec.count("->") != 1:
        raise AdvisorError(f"{where}: key 'einsum' must look like 'bsh,hf->bsf', got {spec!r}")
    lhs, rhs = spec.replace(" ", "").split("->")
    parts = lhs.split(",") + rhs.split(",")
    names = inputs + outputs
    if len(parts) != len(names):
        raise AdvisorError(f"{where}: key 'einsum' = {spec!r} has {len(parts)} tensors, the operator has "
                           f"{len(inputs)} inputs and {len(outputs)} outputs")
    extents: dict[str, int] = {}
    for labs, t, shape in zip(parts, names, shapes):
        if not labs.isalpha() or len(set(labs)) != len(labs):
            raise AdvisorError(f"{where}: key 'einsum' = {spec!r}: '{labs}' must be distinct letters")
        if len(labs) != len(shape):
            raise AdvisorError(f"{where}: key 'einsum' = {spec!r} gives '{t}' {len(labs)} labels, its shape is {list(shape)}")
        for lab, size in zip(labs, shape):
            if extents.setdefault(lab, size) != size:
                raise AdvisorError(f"{where}: key 'einsum' = {spec!r}: label '{lab}' is {extents[lab]} in one "
                                   f"tensor and {size} in '{t}'")
    return parts, set()


def _einsum_flops(labels, shapes) -> float:
    extents = {}
    for labs, shape in zip(labels, shapes):
        extents.update(zip(labs, shape))
    return 2.0 * math.prod(extents.values())


def _derive(kind: str, raw: dict, where: str, inputs, outputs, tensors) -> tuple[list[str], set[str], float]:
    """Labels, uncuttable labels and forward FLOPs from the operator kind and its shapes."""
    ins = [tensors[t].shape for t in inputs]
    outs = [tensors[t].shape for t in outputs]

    def fail(msg: str):
        shapes = ", ".join(f"{t}{list(tensors[t].shape)}" for t in inputs + outputs)
        raise AdvisorError(f"{where}: kind '{kind}' {msg} (shapes: {shapes})")

    def one_output():
        if len(outs) != 1:
            fail("takes exactly one output")
        return outs[0]

    if kind == "matmul":
        out = one_output()
        if len(ins) not in (2, 3):
            fail("takes inputs [activation, weight] or [activation, weight, bias]")
        a, w = ins[0], ins[1]
        if len(a) < 2 or len(a) > 6 or len(w) not in (2, len(a)):
            fail("needs an activation [..., m, k] and a weight [k, n] (or [..., k, n] with the same leading dims)")
        batch = "bspq"[: len(a) - 2]
        if a[-1] != w[-2] or (len(w) == len(a) and tuple(w[:-2]) != tuple(a[:-2])):
            fail("needs the activation's last dimension to equal the weight's first (matrix) dimension")
        if tuple(out) != tuple(a[:-1]) + (w[-1],):
            fail(f"output must have shape {list(a[:-1]) + [w[-1]]}")
        labels = [batch + "mk", (batch if len(w) == len(a) else "") + "kn"]
        if len(ins) == 3:
            if tuple(ins[2]) != (w[-1],):
                fail(f"bias must have shape [{w[-1]}]")
            labels.append("n")
        labels.append(batch + "mn")
        return labels, set(), 2.0 * math.prod(a) * w[-1]
    if kind == "conv2d":
        out = one_output()
        if len(ins) not in (2, 3) or len(ins[0]) != 4 or len(ins[1]) != 4 or len(out) != 4:
            fail("needs input [N, C, H, W], weight [K, C, R, S] (optional bias [K]) and output [N, K, H', W']")
        x, w = ins[0], ins[1]
        if x[1] != w[1] or out[0] != x[0] or out[1] != w[0]:
            fail("needs matching channels (input C = weight C), batch and output channels")
        labels = ["nchw", "kcrs"] + (["k"] if len(ins) == 3 else []) + ["nkhw"]
        if len(ins) == 3 and tuple(ins[2]) != (w[0],):
            fail(f"bias must have shape [{w[0]}]")
        return labels, set("hwrs"), 2.0 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3]
    if kind in ("elementwise", "norm", "softmax"):
        out = one_output()
        base = _FREE[: len(out)]
        labels, no_cut = [], set()
        for t, shape in zip(inputs, ins):
            if len(shape) > len(out):
                fail(f"input '{t}' has more dimensions than the output")
            labs = list(base[len(out) - len(shape):])
            for i, (size, full) in enumerate(zip(shape, out[len(out) - len(shape):])):
                if size != full:
                    if size != 1:
                        fail(f"input '{t}' does not broadcast to the output")
                    labs[i] = string.ascii_uppercase[len(no_cut)]
                    no_cut.add(labs[i])
            labels.append("".join(labs))
        if kind in ("norm", "softmax"):
            no_cut.add(base[-1])
        return labels + [base], no_cut, 0.0
    if kind == "batchnorm":
        out = one_output()
        if len(ins[0]) < 2 or tuple(out) != tuple(ins[0]) or any(tuple(s) != (out[1],) for s in ins[1:]):
            fail("needs input [N, C, ...] with per-channel parameters [C] and an output of the input's shape")
        base = "nc" + "hwd"[: len(out) - 2]
        return [base] + ["c"] * (len(ins) - 1) + [base], set("hwd"), 0.0
    if kind == "pool2d":
        out = one_output()
        if len(ins) != 1 or len(ins[0]) != 4 or len(out) != 4 or tuple(out[:2]) != tuple(ins[0][:2]):
            fail("needs input [N, C, H, W] and output [N, C, H', W']")
        return ["nchw", "nchw"], set("hw"), 0.0
    if kind == "reduce":
        out = one_output()
        x = ins[0] if len(ins) == 1 else fail("takes one input")
        if len(out) >= len(x) or tuple(x[: len(out)]) != tuple(out):
            fail("keeps the input's leading dimensions and sums the trailing ones")
        return [_FREE[: len(x)], _FREE[: len(out)]], set(), 0.0
    if kind == "embedding":
        out = one_output()
        if len(ins) != 2 or len(ins[1]) != 2 or tuple(out) != tuple(ins[0]) + (ins[1][1],):
            fail("needs indices [...], a table [V, D] and output [..., D]")
        lead = "bspq"[: len(ins[0])]
        return [lead, "vz", lead + "z"], set(), 0.0
    if kind == "loss":
        out = one_output()
        if len(ins) != 2 or tuple(ins[0][:-1]) != tuple(ins[1]) or tuple(out) != tuple(ins[1]):
            fail("needs logits [..., V], targets [...] and per-example losses [...]")
        lead = "bspq"[: len(out)]
        return [lead + "v", lead, lead], set(), 0.0
    if kind == "concat":
        out = one_output()
        axis = raw.get("axis")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -len(out) <= axis < len(out):
            raise AdvisorError(f"{where}: kind 'concat' needs key 'axis', a dimension of the output, got {axis!r}")
        axis %= len(out)
        base = _FREE[: len(out)]
        for t, shape in zip(inputs, ins):
            if len(shape) != len(out) or any(s != o for i, (s, o) in enumerate(zip(shape, out)) if i != axis):
                fail(f"input '{t}' must match the output except along axis {axis}")
        if sum(s[axis] for s in ins) != out[axis]:
            fail(f"inputs must add up to the output along axis {axis}")
        return [base] * (len(ins) + 1), {base[axis]}, 0.0
    if kind == "reshape":
        out = one_output()
        x = ins[0] if len(ins) == 1 else fail("takes one input")
        if math.prod(x) != math.prod(out):
            fail("must keep the number of elements")
        keep = 0
        while keep < min(len(x), len(out)) and x[keep] == out[keep] and keep < len(out) - 1:
            keep += 1
        lead = _FREE[:keep]
        a = lead + string.ascii_uppercase[: len(x) - keep]
        b = lead + string.ascii_uppercase[len(x) - keep: len(x) - keep + len(out) - keep]
        return [a, b], set(string.ascii_uppercase[: len(x) - keep + len(out) - keep]), 0.0
    raise AdvisorError(f"{where}: kind '{kind}' needs an explicit 'einsum' giving the labels of its tensors")
