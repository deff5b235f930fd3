"""Run by an interpreter that has MindSpore (tests/test_mindspore_loader.py): check advisor's MindSpore
exports with MindSpore's own code, print one JSON report.

    python -E tests/_mindspore_check.py EXPORT_DIR [EXPORT_DIR ...]

One folder per process keeps MindSpore's global contexts apart (the test runs it so).

Per export folder, what it holds is checked:
* strategy_ckpt.json: read by mindspore.parallel.build_searched_strategy (MindSpore's Python reader,
  used for checkpoint transformation; the C++ reader behind strategy_ckpt_config's load_file needs a
  semi-auto-parallel compile, which MindSpore does not run on CPU); each parameter's layout as
  MindSpore reads it (its cut per dimension, _get_tensor_strategy) must be the cut the operator
  that reads it gives that input in the same file, over the stage's devices, and MindSpore's
  checkpoint slicing (_load_tensor) gives every rank a slice of that shape, covering the tensor;
* operator_strategies.py: sharded_primitives() builds every primitive with its shard() (on CPU
  MindSpore checks the strategies' form, not their sizes), and auto_parallel() wraps a cell in
  AutoParallel with the strategy file's path;
* parallel_context.py: executed (mindspore.set_auto_parallel_context with the exported keywords);
* host_embedding.py: place_embedding_on_host() on a small cell with a tok_embeddings Gather: the
  Gather runs on the CPU (primitive_target) and the table is split off for an optimizer whose
  target is set to "CPU";
* ps_context.py (parameter-server plans): set_ps_context(enable_ps=True) takes effect, and
  place_on_servers() marks the server tensors where MindSpore has set_param_ps (<= 2.7) and stops
  with a sentence naming the version where it does not.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem + "_checked", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_strategy(path: Path) -> dict:
    from mindspore import Tensor
    from mindspore.parallel import build_searched_strategy
    from mindspore.parallel._parallel_serialization import _convert_to_list
    from mindspore.parallel._tensor import _get_tensor_strategy, _load_tensor

    data = json.loads(path.read_text())
    written, items = data["parallel_layout_item"], data["parallel_strategy_item"]
    script = path.parent / "operator_strategies.py"
    stage_devices = _module(script).STAGE_DEVICES if script.exists() else None
    loaded = build_searched_strategy(str(path))
    layouts = _convert_to_list(loaded)
    bad, cut = [], 0
    for name, item in written.items():
        dev_mat, tensor_map = layouts[name][0], layouts[name][1]
        shape = [int(x) for x in item["tensor_shape"]]
        splits = [int(x) for x in _get_tensor_strategy(dev_mat, tensor_map)]     # MindSpore's cut per dim
        cut += any(c > 1 for c in splits)
        if stage_devices is not None and int(np.prod(dev_mat)) != stage_devices:
            bad.append(f"{name}: device matrix {dev_mat} is not the stage's {stage_devices} devices")
        # the operator that reads the parameter must cut that input as the parameter is stored
        users = [v["parallel_strategy"] for k, v in items.items() if k.endswith("_" + name)]
        if not users:
            bad.append(f"{name}: no operator strategy names it")
        elif not any(splits == [int(c) for c in cuts] for strategy in users for cuts in strategy):
            bad.append(f"{name}: stored cut {splits}, its operator cuts its inputs {users}")
        if any(d % c for d, c in zip(shape, splits)):
            bad.append(f"{name}: shape {shape} is not divisible by MindSpore's cuts {splits}")
            continue
        # MindSpore's checkpoint slicing on a tensor of the same rank, two rows per cut
        proxy = [2 * c for c in splits]
        full = np.arange(int(np.prod(proxy)), dtype=np.float32).reshape(proxy)
        seen = set()
        for rank in range(int(np.prod(dev_mat))):
            part = _load_tensor(Tensor(full), dev_mat, tensor_map, rank_id=rank)
            if list(part.shape) != [2] * len(proxy):
                bad.append(f"{name}: rank {rank} gets a slice of {list(part.shape)} of {proxy}")
                break
            seen.update(part.reshape(-1).astype(np.int64).tolist())
        if len(seen) != full.size:
            bad.append(f"{name}: the ranks' slices cover {len(seen)} of {full.size} elements")
    return {"parameters": len(written), "loaded": len(loaded), "cut": cut, "problems": bad}


def check_operator_script(path: Path) -> dict:
    import mindspore as ms
    from mindspore import nn

    mod = _module(path)
    prims = mod.sharded_primitives()
    count = sum(len(v) for v in prims.values())
    shards = [p.in_strategy for v in prims.values() for p in v if getattr(p, "in_strategy", None) is not None]

    class Tiny(nn.Cell):
        def construct(self, x):
            return x

    wrapped = mod.auto_parallel(Tiny())
    loaded = getattr(wrapped, "_load_strategy_file_path", None)       # what load_param_strategy_file set
    return {"operators": len(prims), "primitives": count, "with_strategy": len(shards),
            "auto_parallel": type(wrapped).__name__, "strategy_file": str(loaded) if loaded else None,
            "ms": ms.__version__}


def check_context(path: Path) -> dict:
    import mindspore as ms

    _module(path)
    return {"parallel_mode": ms.get_auto_parallel_context("parallel_mode"),
            "device_num": ms.get_auto_parallel_context("device_num"),
            "pipeline_stages": ms.get_auto_parallel_context("pipeline_stages")}


def check_host_embedding(path: Path) -> dict:
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    mod = _module(path)

    class Embedding(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding_weight = Parameter(Tensor(np.ones((16, 4), np.float32)), name="embedding_weight")
            self.gather = ops.Gather()

        def construct(self, ids):
            return self.gather(self.embedding_weight, ids, 0)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = Embedding()
            self.head = nn.Dense(4, 2)

        def construct(self, ids):
            return self.head(self.tok_embeddings(ids))

    net = Net()
    host, device = mod.place_embedding_on_host(net)
    nn.Adam(host, learning_rate=1e-3).target = "CPU"          # the split feeds an optimizer with a CPU target
    return {"host": sorted(p.name for p in host), "device": sorted(p.name for p in device),
            "gather_target": net.tok_embeddings.gather.primitive_target, "ms": ms.__version__}


def check_ps_context(path: Path) -> dict:
    """A parameter-server plan's ps_context.py: set_ps_context, then place_on_servers on a cell with a
    server tensor (MindSpore 2.8+ has no set_param_ps: the script must say so and stop)."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    mod = _module(path)
    out = {"enable_ps": bool(ms.get_ps_context("enable_ps")), "has_set_param_ps": hasattr(Parameter, "set_param_ps")}

    class Net(nn.Cell):
        def __init__(self, names):
            super().__init__()
            for name in names:
                setattr(self, name, Parameter(Tensor(np.ones((4, 2), np.float32)), name=name))

        def construct(self, x):
            return x

    try:
        mod.place_on_servers(Net(mod.SERVER_TENSORS))
        out["placed"] = True
    except RuntimeError as exc:
        out["placed"] = False
        out["refusal"] = str(exc)
    return out


CHECKS = {"strategy_ckpt.json": check_strategy, "operator_strategies.py": check_operator_script,
          "parallel_context.py": check_context, "host_embedding.py": check_host_embedding,
          "ps_context.py": check_ps_context}


def main(folders: list[str]) -> None:
    import mindspore as ms

    ms.set_device("CPU")
    out = {}
    for folder in folders:
        report = {}
        for name, check in CHECKS.items():
            path = Path(folder) / name
            if path.exists():
                try:
                    report[name] = check(path)
                except Exception as exc:       # noqa: BLE001 - reported, the test decides
                    report[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        out[folder] = report
    print("MINDSPORE-CHECK " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
