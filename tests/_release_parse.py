"""Parse exported files with one release of the target's own code; run as a separate process whose
PYTHONPATH puts that release first (tests/test_export_releases.py).

    python tests/_release_parse.py deepspeed|torchtitan CASES.json

CASES.json is a list of {"name", "path", "dp", "world"}; the script prints one JSON object:
{"version": the release imported, "cases": {name: {"error": str | None, ...what the parser read}}}.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types


class MPU:
    """The slice of a model-parallel unit DeepSpeedConfig asks for (data-parallel world size); the
    in-process DeepSpeed tests use it too."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def deepspeed_cases(cases: list[dict]) -> dict:
    import deepspeed
    import deepspeed.runtime.config as ds_config_module
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig asks the process group for this rank before the mpu; rank 0 is what a launch has
    ds_config_module.dist.get_rank = lambda *a, **k: 0
    out = {}
    for case in cases:
        with open(case["path"], encoding="utf-8") as f:
            config = json.load(f)
        try:
            parsed = DeepSpeedConfig(config, mpu=MPU(case["dp"]))
        except Exception as exc:   # the release's own refusal is the finding
            out[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[case["name"]] = {"error": None, "train_batch_size": parsed.train_batch_size,
                             "micro_batch": parsed.train_micro_batch_size_per_gpu,
                             "accumulation": parsed.gradient_accumulation_steps,
                             "zero_stage": parsed.zero_optimization_stage}
    return {"version": deepspeed.__version__, "cases": out}


def load_torchtitan():
    """(package folder, ConfigManager, ParallelDims) from torchtitan.config without running
    torchtitan/__init__.py, which imports Triton kernels absent on CPU; the in-process torchtitan tests
    use it too. ImportError when torchtitan is absent."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            raise ImportError("torchtitan is not installed")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    return sys.modules["torchtitan"].__path__[0], ConfigManager, ParallelDims


def torchtitan_cases(cases: list[dict]) -> dict:
    import pathlib

    where, ConfigManager, ParallelDims = load_torchtitan()
    # the release actually imported: the dist-info beside that copy of the package
    infos = sorted(pathlib.Path(where).parent.glob("torchtitan-*.dist-info"))
    version = infos[0].name[len("torchtitan-"):-len(".dist-info")] if infos else "unknown"
    out = {}
    for case in cases:
        try:
            cfg = ConfigManager().parse_args(["--job.config_file", case["path"]])
            par = cfg.parallelism
            dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                dp_shard=par.data_parallel_shard_degree, cp=par.context_parallel_degree,
                                tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                                ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree,
                                world_size=case["world"])
        except (Exception, SystemExit) as exc:   # the release's own refusal is the finding
            out[case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[case["name"]] = {"error": None, "dp": dims.dp_replicate * dims.dp_shard, "tp": dims.tp,
                             "pp": dims.pp, "cp": dims.cp}
    return {"version": version, "cases": out}


if __name__ == "__main__":
    target, path = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    result = {"deepspeed": deepspeed_cases, "torchtitan": torchtitan_cases}[target](cases)
    print("RESULT " + json.dumps(result))
