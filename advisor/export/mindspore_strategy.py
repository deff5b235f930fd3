"""MindSpore operator strategies of a drec/ilp plan: the shard() calls and a strategy file.

Two files, from the plan's ``operator_strategies`` (advisor.search.intra_op.record):

* ``operator_strategies.py``: for every operator of the plan's graph, the ``shard()`` of the MindSpore
  primitive(s) that compute it, in MindSpore's tensor form, and the two ways to turn semi-automatic
  parallelism on: the current ``mindspore.parallel.auto_parallel.AutoParallel(net,
  parallel_mode="semi_auto")`` wrapper with ``load_param_strategy_file`` (MindSpore 2.6+;
  docs/api/api_python/parallel/mindspore.parallel.auto_parallel.AutoParallel.rst in
  mindspore-ai/mindspore) and the older ``mindspore.set_auto_parallel_context(parallel_mode=
  "semi_auto_parallel", strategy_ckpt_config={"load_file": ...})``.
* ``strategy_ckpt.json``: the strategy checkpoint in MindSpore's JSON form, which
  ``strategy_ckpt_config["load_file"]`` reads when the name ends in .json (mindspore/context.py,
  set_auto_parallel_context docstring: "If the file name extension is `.json`, the file is loaded in
  JSON format"; the reader is StrategyCheckpointInfo::FromJson in
  mindspore/ccsrc/frontend/parallel/strategy_checkpoint/strategy_checkpoint_info.cc: keys
  current_stage, parallel_strategy_item {name: {stage, parallel_strategy}}, parallel_layout_item
  {parameter: {dev_matrix, tensor_map, tensor_shape, field, opt_weight_shard_step,
  opt_weight_shard_size}}). An operator's item is named ``<Primitive>_<its first parameter>``, the key
  MindSpore looks up (ExtractStrategyAndInit in frontend/parallel/step_parallel.cc).

Tensor form. advisor's graph keeps a weight's structure (wq[h, g, r, d]); MindSpore's cells multiply
2-D activations by 2-D weights (MindFormers' Linear reshapes x to [-1, in]). A dimension of the
MindSpore form is a group of advisor labels and is cut by the product of their cuts: MatMul ((rows,
k), (k, n)) with rows the activation's own labels, k the contracted ones, n the weight's own (MatMul
with transpose_b=False, weight [in, out]); BatchMatMul when a label is in both and the output (MoE
experts); a bias is an Add ((rows, n), (n,)). The plan's cuts are inside one tensor-parallel group;
MindSpore's cover a pipeline stage, so the batch dimension's cut is multiplied by dp and the
sequence's by cp (the data and context parallelism of the plan), as MindFormers' strategies are
((dp, 1), (1, mp)) (mindformers/modules/layers.py Linear.shard).

Everything written comes from the plan's numbers through repr() and json; no string of the plan
becomes code (operator and parameter names are string literals or JSON keys).
"""

from __future__ import annotations

import json
import math
import re

from advisor.errors import AdvisorError
from advisor.export._common import comment_block, header_lines, stage_layers
from advisor.plan import Plan

STRATEGY_FILE = "strategy_ckpt.json"
SCRIPT_FILE = "operator_strategies.py"
_LABELS = re.compile(r"[a-z]{0,16}")
_PREFIXES = {"layer.": False, "moe_layer.": True}   # template prefix -> MoE layers


def _ints(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 2 ** 20
                                              for x in value):
        raise AdvisorError(f"plan operator_strategies: {where} must be a list of positive integers")
    return tuple(value)


class _Op:
    """One operator of the plan: labels and cuts per input, output labels, parameters."""

    def __init__(self, name: str, rec: dict, cuts, dp: int, cp: int):
        where = f"operator {name[:60]!r}"
        if not isinstance(rec, dict):
            raise AdvisorError(f"plan operator_strategies: {where} must be a mapping")
        self.name, self.kind = name, rec.get("kind")
        labels, outs = rec.get("labels"), rec.get("out_labels")
        if not isinstance(labels, list) or not isinstance(outs, list) or not all(
                isinstance(x, str) and _LABELS.fullmatch(x) for x in labels + outs):
            raise AdvisorError(f"plan operator_strategies: {where} has no input and output labels (a plan written "
                               f"before advisor recorded them: run recommend again)")
        if not isinstance(cuts, list) or len(cuts) != len(labels):
            raise AdvisorError(f"plan operator_strategies: {where} must have one list of cuts per input")
        self.labels = labels
        self.cuts = [_ints(c, f"{where} input {i}") for i, c in enumerate(cuts)]
        if any(len(c) != len(lab) for c, lab in zip(self.cuts, labels)):
            raise AdvisorError(f"plan operator_strategies: {where}: cuts and labels differ in length")
        self.out = set("".join(outs))
        params = rec.get("parameters", [])
        self.params = [p for p in params if isinstance(p, str)] if isinstance(params, list) else []
        self.inputs = list(rec.get("inputs", {})) if isinstance(rec.get("inputs"), dict) else []
        shapes = rec.get("shapes")
        if not isinstance(shapes, list) or len(shapes) != len(labels):
            raise AdvisorError(f"plan operator_strategies: {where} has no input shapes (run recommend again)")
        self.label_cut: dict[str, int] = {}
        self.size: dict[str, int] = {}
        for i, (labs, cs) in enumerate(zip(labels, self.cuts)):
            dims = _ints(shapes[i], f"{where} shape {i}")
            for lab, c, n in zip(labs, cs, dims):
                self.label_cut[lab] = max(self.label_cut.get(lab, 1), c)
                self.size[lab] = max(self.size.get(lab, 1), n)
        self.outer = {"b": dp, "s": cp}

    def cut(self, labels) -> int:
        """The cut of a MindSpore dimension made of these labels, data/context parallelism included."""
        return math.prod(self.label_cut.get(lab, 1) * self.outer.get(lab, 1) for lab in labels)

    def shape(self, groups) -> list[int]:
        """The MindSpore-form shape of a tensor whose dimensions are these label groups."""
        return [math.prod(self.size.get(lab, 1) for lab in g) for g in groups]

    def param_of(self, i: int) -> str | None:
        name = self.inputs[i] if i < len(self.inputs) else None
        return name if name in self.params else None


def _matmul(op: _Op) -> list[tuple[str, tuple, str | None, tuple]]:
    """One MatMul (BatchMatMul with experts) per weight, one Add per bias (as _calls)."""
    x = op.labels[0]
    calls = []
    for i, w in enumerate(op.labels[1:], start=1):
        param = op.param_of(i)
        shared = [lab for lab in x if lab in w]
        if len(w) < 2 or not shared:      # a bias: added to the output columns it carries
            rows = [lab for lab in x if lab not in w and lab in op.out] or list(x[:-1])
            strategy = ((op.cut(rows), op.cut(w)), (op.cut(w),))
            calls.append(("ops.Add()", strategy, param, (w,)))
            continue
        batch = [lab for lab in shared if lab in op.out]
        k = [lab for lab in shared if lab not in op.out]
        rows = [lab for lab in x if lab not in w]
        n = [lab for lab in w if lab not in x]
        if batch:
            strategy = ((op.cut(batch), op.cut(rows), op.cut(k)), (op.cut(batch), op.cut(k), op.cut(n)))
            calls.append(("ops.BatchMatMul()", strategy, param, (batch, k, n)))
        else:
            strategy = ((op.cut(rows), op.cut(k)), (op.cut(k), op.cut(n)))
            calls.append(("ops.MatMul()", strategy, param, (k, n)))
    return calls


def _calls(op: _Op, norm: str) -> list[tuple[str, tuple, str | None, tuple]]:
    """The MindSpore primitives of one operator: (primitive, in_strategy, its parameter or None, the
    parameter's dimensions in MindSpore's form as label groups); see the module docstring."""
    lab = op.labels
    if op.kind == "matmul":
        return _matmul(op)
    if op.kind == "embedding":          # Gather(table [v, h], indices [b, s])
        strategy = ((op.cut("v"), op.cut("h")), (op.cut("b"), op.cut("s")))
        return [("ops.Gather()", strategy, op.param_of(1), ("v", "h"))]
    if op.kind == "norm":
        x = (op.cut("b"), op.cut("s"), op.cut("h"))
        if norm == "rmsnorm":
            return [("ops.RmsNorm()", (x, (op.cut("h"),)), op.param_of(1), ("h",))]
        return [("ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1)", (x, (op.cut("h"),), (op.cut("h"),)),
                 op.param_of(1), ("h",))]
    if op.kind == "elementwise":        # residual: Add of the two activations, then the bias
        x = tuple(op.cut(c) for c in lab[0])
        calls = [("ops.Add()", (x, x), None, ())]
        if len(lab) > 2:
            calls.append(("ops.Add()", (x, (op.cut(lab[2]),)), op.param_of(2), (lab[2],)))
        return calls
    if op.kind == "attention":          # softmax(q k^T) v with q, k, v as [batch, heads, seq, head dim]
        q = (op.cut("b"), op.cut("gr"), op.cut("s"), 1)
        kv = (op.cut("b"), op.cut("gr"), 1, 1)
        return [("ops.BatchMatMul(transpose_b=True)", (q, kv), None, ()),
                ("ops.Softmax()", ((q[0], q[1], q[2], 1),), None, ()),
                ("ops.BatchMatMul()", (q, kv), None, ())]
    if op.kind == "loss":               # logits and one-hot labels as [tokens, vocabulary]
        x = (op.cut("bs"), op.cut("v"))
        return [("ops.SoftmaxCrossEntropyWithLogits()", (x, x), None, ())]
    return []


def _layer_names(plan: Plan, param: str) -> list[tuple[str, int]]:
    """(parameter name per layer, pipeline stage) of a template parameter ('layer.wq' -> 'layer.0.wq')."""
    m = plan.model
    stages = stage_layers(plan)
    bounds = [sum(stages[:k + 1]) for k in range(len(stages))]

    def stage(i: int) -> int:
        return next(k for k, b in enumerate(bounds) if i < b)

    for prefix, moe in _PREFIXES.items():
        if param.startswith(prefix):
            rest = param[len(prefix):]
            return [(f"{prefix}{i}.{rest}", stage(i)) for i in range(m.num_layers) if m.is_moe_layer(i) == moe]
    first = param in ("wte", "wpe")
    return [(param, 0 if first else len(stages) - 1)]


def _layout(cuts: tuple, shape_devices: int) -> dict:
    """A parameter's TensorLayout as MindSpore's JSON checkpoint writes it: the device matrix is the
    replicas then each cut dimension; tensor_map gives, per dimension, the device-matrix axis counted
    from the right (-1: not cut)."""
    cut_dims = [c for c in cuts if c > 1]
    replicas = max(shape_devices // max(math.prod(cut_dims), 1), 1)
    dev = [replicas] + cut_dims
    tmap, k = [], 0
    for c in cuts:
        if c > 1:
            k += 1
            tmap.append(len(dev) - 1 - k)
        else:
            tmap.append(-1)
    return {"dev_matrix": dev, "tensor_map": tmap, "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}


def strategy_files(plan: Plan, notes: list[str], unsupported: list[str]) -> dict[str, str]:
    """The two files (see the module docstring), or none when the plan has no operator strategies."""
    rec = plan.operator_strategies
    if not isinstance(rec, dict) or not isinstance(rec.get("operators"), dict) or not isinstance(rec.get("strategies"), dict):
        return {}
    s = plan.strategy
    stage_devices = s.dp * s.tp * s.cp
    ops = [_Op(name, rec["operators"].get(name), cuts, s.dp, s.cp) for name, cuts in rec["strategies"].items()]
    fixed = rec.get("fixed") or []
    if not isinstance(fixed, list) or not all(isinstance(x, str) for x in fixed):
        raise AdvisorError("plan operator_strategies: 'fixed' must be a list of operator names")
    fixed = set(fixed)
    lines, items, layouts, missing = [], {}, {}, []
    for op in ops:
        calls = _calls(op, plan.model.norm)
        if not calls:
            missing.append(op.name)
            continue
        mark = "  # given by --operator-strategies" if op.name in fixed else ""
        body = ", ".join(f"{prim}.shard({strategy!r})" for prim, strategy, _, _ in calls)
        lines.append(f"    {op.name!r}: ({body},),{mark}\n")
        for prim, strategy, param, groups in calls:
            if param is None:
                continue
            primitive = prim.split("(")[0].split(".")[-1]
            cuts = tuple(op.cut(g) for g in groups)
            for name, stage in _layer_names(plan, param):
                items[f"{primitive}_{name}"] = {"stage": stage, "parallel_strategy": [list(x) for x in strategy]}
                layouts[name] = {**_layout(cuts, stage_devices), "tensor_shape": op.shape(groups)}
    if missing:
        unsupported.append(f"operator_strategies: {', '.join(sorted(missing)[:6])}: no single MindSpore primitive computes "
                           "these (MoE token dispatch and combine); MindFormers' MoE layer lays them out from "
                           "expert_model_parallel")
    ckpt = {"current_stage": 0, "parallel_strategy_item": items, "parallel_layout_item": layouts}
    notes.append(f"{SCRIPT_FILE}: one shard() per operator in MindSpore's tensor form; {STRATEGY_FILE}: the strategy "
                 "checkpoint (JSON form) with items named <Primitive>_<parameter> after advisor's graph (rename them "
                 "to your cell's parameter names); its parameter layouts leave the optimizer shard to MindSpore")
    return {SCRIPT_FILE: _script(plan, lines, stage_devices), STRATEGY_FILE: json.dumps(ckpt, indent=1) + "\n"}


def _script(plan: Plan, lines: list[str], stage_devices: int) -> str:
    s = plan.strategy
    context = {"parallel_mode": "semi_auto_parallel", "device_num": plan.cluster.devices, "pipeline_stages": s.pp}
    return (
        comment_block(header_lines(plan, "MindSpore operator strategies (semi-automatic parallelism)"))
        + "# shard() strategies cover one pipeline stage: batch cuts include dp, sequence cuts cp.\n"
        + "import os\n\nimport mindspore as ms\nfrom mindspore import ops\n\n"
        + f"STAGE_DEVICES = {stage_devices!r}\n"
        + f"STRATEGY_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), {STRATEGY_FILE!r})\n\n\n"
        + "def sharded_primitives():\n"
        + "    \"\"\"advisor operator -> the MindSpore primitives that compute it, each with its shard().\"\"\"\n"
        + "    return {\n" + "".join(lines) + "    }\n\n\n"
        + "def auto_parallel(net):\n"
        + "    \"\"\"MindSpore 2.6+: wrap the network for semi-automatic parallelism and load the strategies.\"\"\"\n"
        + "    from mindspore.parallel.auto_parallel import AutoParallel\n\n"
        + "    parallel_net = AutoParallel(net, parallel_mode=\"semi_auto\")\n"
        + "    parallel_net.load_param_strategy_file(STRATEGY_FILE)\n"
        + (f"    parallel_net.pipeline(stages={s.pp!r})\n" if s.pp > 1 else "")
        + "    return parallel_net\n\n\n"
        + "def legacy_context():\n"
        + "    \"\"\"Before MindSpore 2.6: the same through set_auto_parallel_context.\"\"\"\n"
        + "    ms.set_auto_parallel_context(\n"
        + "".join(f"        {k}={v!r},\n" for k, v in context.items())
        + "        strategy_ckpt_config={\"load_file\": STRATEGY_FILE, \"only_trainable_params\": True},\n"
        + "    )\n"
    )
