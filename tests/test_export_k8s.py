"""Kubernetes export: a Kubeflow PyTorchJob (kubeflow.org/v1) that launches the plan's framework.

Every standard plan (tests/_export_plans.py) is exported as a job of each framework a PyTorchJob launches
(Megatron-LM, torchtitan, DeepSpeed). With the Kubeflow Training Operator SDK installed (``pip install
kubeflow-training``, which brings the Kubernetes client), every key of the manifests is checked recursively
against the SDK's generated models (KubeflowOrgV1PyTorchJob ... V1Container, and V1ConfigMap: their
attribute_map is the API's field names and openapi_types their types). Always, the keys are checked against
the fields documented in the Kubeflow Training Operator PyTorchJob guide and API reference
(https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/ and the kubeflow.org/v1
API: spec.pytorchReplicaSpecs, spec.nprocPerNode, spec.runPolicy, ReplicaSpec replicas/restartPolicy/
template) and the Kubernetes core/v1 PodSpec/Container/ConfigMap reference. The torchrun command is parsed
by torch's own torchrun argument parser, and what it runs by that framework's own parser: the Megatron flag
table, torchtitan's ConfigManager on the mounted TOML, DeepSpeed's argument group and DeepSpeedConfig on the
mounted ds_config.json.
"""

from __future__ import annotations

import json

import pytest
import yaml

from _export_plans import make_plan, plans
from _release_parse import MPU, load_torchtitan
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.export.k8s import CONFIG_DIR
from test_export_megatron import megatron_parser

IMAGE = "registry.example.com/team/trainer:1.0"
JOB_FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")
DOC_FIELDS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "configmap": {"apiVersion", "kind", "metadata", "data"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "spec": {"pytorchReplicaSpecs", "nprocPerNode", "runPolicy", "elasticPolicy"},
    "runPolicy": {"cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend"},
    "replica": {"replicas", "restartPolicy", "template"},
    "template": {"metadata", "spec"},
    "podSpec": {"initContainers", "containers", "volumes", "nodeSelector", "tolerations", "affinity", "hostNetwork"},
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env", "resources", "volumeMounts"},
    "resources": {"limits", "requests"},
    "volumeMount": {"name", "mountPath", "readOnly"},
    "volume": {"name", "emptyDir", "configMap"},
}
REPLICA_TYPES = {"Master", "Worker"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


def _split(result) -> tuple[dict | None, dict]:
    """(the ConfigMap or None, the PyTorchJob) of an export's one YAML file."""
    docs = list(yaml.safe_load_all(result.files["pytorchjob.yaml"]))
    kinds = [d["kind"] for d in docs]
    assert kinds in (["PyTorchJob"], ["ConfigMap", "PyTorchJob"]), kinds
    return (docs[0] if len(docs) == 2 else None), docs[-1]


@pytest.fixture(scope="module")
def exported():
    """(plan name, framework) -> (plan, result, ConfigMap or None, PyTorchJob), for every job the export writes;
    the pairs it refuses (a model without a torchtitan flavor, DeepSpeed's cp with pp) are left out."""
    out = {}
    for name, plan in plans().items():
        for framework in JOB_FRAMEWORKS:
            try:
                result = export_plan(plan, "k8s", k8s_framework=framework,
                                     image=None if framework == "megatron" else IMAGE)
            except AdvisorError as exc:
                assert "flavor" in str(exc) or "DeepSpeed" in str(exc), (name, framework, str(exc))
                continue
            out[name, framework] = (plan, result, *_split(result))
    assert {fw for _, fw in out} == set(JOB_FRAMEWORKS) and len(out) >= 20
    return out


def _pod(job: dict, replica: str = "Master") -> dict:
    return job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]


def test_fields_are_documented(exported):
    for key, (plan, _, config_map, doc) in exported.items():
        assert set(doc) <= DOC_FIELDS[""] and doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
        assert set(doc["metadata"]) <= DOC_FIELDS["metadata"]
        spec = doc["spec"]
        assert set(spec) <= DOC_FIELDS["spec"], key
        assert set(spec["runPolicy"]) <= DOC_FIELDS["runPolicy"] and spec["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
        assert set(spec["pytorchReplicaSpecs"]) <= REPLICA_TYPES
        for replica in spec["pytorchReplicaSpecs"].values():
            assert set(replica) <= DOC_FIELDS["replica"] and replica["restartPolicy"] in RESTART_POLICIES
            assert set(replica["template"]) <= DOC_FIELDS["template"]
            pod = replica["template"]["spec"]
            assert set(pod) <= DOC_FIELDS["podSpec"]
            (container,) = pod["containers"]
            assert set(container) <= DOC_FIELDS["container"], key
            assert container["name"] == "pytorch"       # the operator looks for this container name
            for init in pod.get("initContainers", []):
                assert set(init) <= DOC_FIELDS["container"], key
            assert set(container["resources"]) <= DOC_FIELDS["resources"]
            volumes = {v["name"] for v in pod["volumes"]}
            for volume in pod["volumes"]:
                assert set(volume) <= DOC_FIELDS["volume"], key
            for mount in container["volumeMounts"]:
                assert set(mount) <= DOC_FIELDS["volumeMount"] and mount["name"] in volumes, key
        if config_map is not None:
            assert set(config_map) <= DOC_FIELDS["configmap"] and config_map["apiVersion"] == "v1"
            (volume,) = [v for v in _pod(doc)["volumes"] if "configMap" in v]
            assert volume["configMap"]["name"] == config_map["metadata"]["name"]
            assert len(config_map["metadata"]["name"]) <= 63


def test_nodes_and_processes(exported):
    for key, (plan, _, _, doc) in exported.items():
        specs = doc["spec"]["pytorchReplicaSpecs"]
        pods = specs["Master"]["replicas"] + specs.get("Worker", {}).get("replicas", 0)
        assert specs["Master"]["replicas"] == 1
        assert pods == plan.cluster.nodes, key
        nproc = int(doc["spec"]["nprocPerNode"])
        container = _pod(doc)["containers"][0]
        resource = "huawei.com/Ascend910" if "Ascend" in plan.hardware.device.name else "nvidia.com/gpu"
        assert container["resources"]["limits"][resource] == str(nproc)
        if plan.cluster.devices % plan.cluster.nodes == 0:
            assert nproc * pods == plan.cluster.devices, key
        if "Worker" in specs:
            assert _pod(doc, "Worker") == _pod(doc), key


def _torchrun(doc: dict):
    run = pytest.importorskip("torch.distributed.run")
    command = _pod(doc)["containers"][0]["command"]
    assert command[0] == "torchrun"
    ns = run.get_args_parser().parse_args(command[1:])
    assert int(ns.nproc_per_node) == int(doc["spec"]["nprocPerNode"])
    return ns


def test_megatron_jobs_run_pretrain_gpt_with_the_plans_degrees(exported):
    parser = megatron_parser()
    for (name, framework), (plan, _, config_map, doc) in exported.items():
        if framework != "megatron":
            continue
        ns = _torchrun(doc)
        assert int(ns.nnodes) == plan.cluster.nodes and not ns.module
        assert ns.training_script.endswith("pretrain_gpt.py") and config_map is None
        args = parser.parse_args(ns.training_script_args)
        assert args.tensor_model_parallel_size == plan.strategy.tp and args.pipeline_model_parallel_size == plan.strategy.pp


def _mounted(config_map: dict, tmp_path, arg: str):
    """The ConfigMap file a command-line path under CONFIG_DIR names, written where the test can read it."""
    assert arg.startswith(CONFIG_DIR + "/")
    name = arg[len(CONFIG_DIR) + 1:]
    path = tmp_path / name
    path.write_text(config_map["data"][name])
    return path


def test_torchtitan_jobs_run_torchtitan_train_on_the_mounted_toml(exported, tmp_path):
    try:
        _, config_manager, parallel_dims = load_torchtitan()
    except Exception as exc:  # pragma: no cover - absent, or a torchtitan we cannot load
        pytest.skip(f"torchtitan cannot be imported here: {exc}")
    checked = 0
    for (name, framework), (plan, _, config_map, doc) in exported.items():
        if framework != "torchtitan":
            continue
        ns = _torchrun(doc)
        assert ns.module and ns.training_script == "torchtitan.train"      # torchtitan's run_train.sh
        args = list(ns.training_script_args)
        assert args[0] == "--job.config_file" and len(args) == 2
        path = _mounted(config_map, tmp_path, args[1])
        cfg = config_manager().parse_args(["--job.config_file", str(path)])
        par = cfg.parallelism
        dims = parallel_dims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                             cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                             pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                             etp=par.expert_tensor_parallel_degree, world_size=plan.strategy.devices)
        assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp) == (
            plan.strategy.dp, plan.strategy.tp, plan.strategy.pp, plan.strategy.cp), name
        assert cfg.training.global_batch_size == plan.training.global_batch_size, name
        assert cfg.model.flavor != "debugmodel", name
        checked += 1
    assert checked >= 5


def test_deepspeed_jobs_run_train_py_with_the_mounted_config(exported, tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    import argparse

    import deepspeed
    import deepspeed.runtime.config as ds_config_module
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    checked = 0
    for (name, framework), (plan, _, config_map, doc) in exported.items():
        if framework != "deepspeed":
            continue
        ns = _torchrun(doc)
        assert ns.training_script == "train.py" and not ns.module
        # train.py's parser as DeepSpeed's tutorials build it (deepspeed.add_config_arguments)
        args = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(ns.training_script_args)
        assert args.deepspeed
        config = json.loads(_mounted(config_map, tmp_path, args.deepspeed_config).read_text())
        parsed = DeepSpeedConfig(config, mpu=MPU(plan.strategy.dp))
        assert parsed.train_batch_size == plan.training.global_batch_size, name
        assert parsed.train_micro_batch_size_per_gpu == plan.strategy.micro_batch_size, name
        assert parsed.zero_optimization_stage == plan.strategy.zero_stage, name
        env = {e["name"]: e["value"] for e in _pod(doc)["containers"][0]["env"]}
        assert env["PYTHONPATH"] == CONFIG_DIR and "pipeline_settings.py" in config_map["data"]
        checked += 1
    assert checked >= 5


def test_the_mounted_files_are_the_frameworks_own_export(exported):
    """What the job reads is exactly what --to torchtitan / --to deepspeed writes (less DeepSpeed's ssh launcher,
    which torchrun replaces), so it is priced and checked the same; the YAML gives the text back unchanged."""
    for (name, framework), (plan, result, config_map, _) in exported.items():
        if framework == "megatron":
            continue
        files = export_plan(plan, framework).files
        assert config_map["data"] == {k: v for k, v in files.items() if not k.endswith(".sh")}, (name, framework)


def test_the_job_launches_the_plans_framework():
    titan = plans()["llama8b_torchtitan_sac"]
    result = export_plan(titan, "k8s", image=IMAGE)
    assert not result.unsupported, result.unsupported
    _, job = _split(result)
    assert _pod(job)["containers"][0]["command"][5:7] == ["-m", "torchtitan.train"]
    assert "running torchtitan 0.2.2" in result.files["pytorchjob.yaml"].splitlines()[0]
    megatron = export_plan(plans()["llama8b_dp_drec"], "k8s")
    assert not megatron.unsupported and _split(megatron)[0] is None
    # asked for another framework: said, so that it exits 2 without --lossy
    other = export_plan(titan, "k8s", k8s_framework="megatron")
    assert other.unsupported[0].startswith("training.framework = torchtitan: the plan was priced for torchtitan")
    ds_plan = make_plan("llama3-8b", "dgx-h100", 2, {"dp": 16, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4,
                                                     "zero_stage": 2}, global_batch_size=64, seq_length=4096,
                        framework="deepspeed")
    ds = export_plan(ds_plan, "k8s", image=IMAGE)
    assert not ds.unsupported, ds.unsupported
    config_map, job = _split(ds)
    assert set(config_map["data"]) == {"ds_config.json", "pipeline_settings.py", "config.json"}
    assert any("train.py is yours" in n for n in ds.notes)


def test_refusals_name_what_is_missing():
    titan = plans()["llama8b_torchtitan_sac"]
    with pytest.raises(AdvisorError, match="needs --image IMAGE: an image with torchtitan 0.2.1"):
        export_plan(titan, "k8s", "0.2.1")
    with pytest.raises(AdvisorError, match="supports 0.2.0, 0.2.1, 0.2.2"):
        export_plan(titan, "k8s", "0.15", image=IMAGE)
    with pytest.raises(AdvisorError, match="not an image reference"):
        export_plan(titan, "k8s", image="img; rm -rf /")
    with pytest.raises(AdvisorError, match="--image goes with --to k8s"):
        export_plan(titan, "torchtitan", image=IMAGE)
    with pytest.raises(AdvisorError, match="ships no flavor of gpt3-175b"):
        export_plan(plans()["gpt3_gpipe_fp16"], "k8s", k8s_framework="torchtitan", image=IMAGE)
    with pytest.raises(AdvisorError, match="takes megatron, torchtitan, deepspeed, mindspore"):
        export_plan(titan, "k8s", k8s_framework="slurm")
    pytorch = make_plan("llama3-8b", "dgx-h100", 1, {"dp": 8, "tp": 1, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4,
                                                     "zero_stage": 3}, global_batch_size=32, seq_length=4096,
                        framework="pytorch")
    with pytest.raises(AdvisorError, match="priced for PyTorch .* no job here launches; price it for torchtitan"):
        export_plan(pytorch, "k8s")


def _check_against_models(obj, type_name: str, path: str, models: list) -> None:
    """Recursively: every key is a field of the generated model class; values have the right shape."""
    if type_name.startswith("list["):
        assert isinstance(obj, list), path
        for i, item in enumerate(obj):
            _check_against_models(item, type_name[5:-1], f"{path}[{i}]", models)
        return
    if type_name.startswith("dict("):
        assert isinstance(obj, dict), path
        value_type = type_name[5:-1].split(",", 1)[1].strip()
        for key, value in obj.items():
            _check_against_models(value, value_type, f"{path}.{key}", models)
        return
    primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if type_name in primitive:
        assert isinstance(obj, primitive[type_name]), f"{path}: {obj!r} is not {type_name}"
        return
    cls = next((getattr(m, type_name) for m in models if hasattr(m, type_name)), None)
    assert cls is not None, f"{path}: no model class {type_name}"
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    assert isinstance(obj, dict), path
    for key, value in obj.items():
        assert key in by_json, f"{path}: {key!r} is not a field of {type_name} (fields: {sorted(by_json)})"
        _check_against_models(value, cls.openapi_types[by_json[key]], f"{path}.{key}", models)


def test_manifest_matches_the_training_operator_api(exported):
    pytest.importorskip("kubeflow.training")
    import kubernetes.client.models as k8s_models
    import kubeflow.training.models as kf_models

    for key, (_, _, config_map, doc) in exported.items():
        _check_against_models(doc, "KubeflowOrgV1PyTorchJob", str(key), [kf_models, k8s_models])
        if config_map is not None:
            _check_against_models(config_map, "V1ConfigMap", str(key), [k8s_models])


def test_the_check_catches_a_misspelled_field(exported):
    pytest.importorskip("kubeflow.training")
    import copy

    import kubernetes.client.models as k8s_models
    import kubeflow.training.models as kf_models

    doc = copy.deepcopy(exported["llama8b_dp_drec", "megatron"][3])
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(AssertionError):
        _check_against_models(doc, "KubeflowOrgV1PyTorchJob", "bad", [kf_models, k8s_models])
    config_map = copy.deepcopy(exported["llama8b_torchtitan_sac", "torchtitan"][2])
    config_map["date"] = config_map.pop("data")
    with pytest.raises(AssertionError):
        _check_against_models(config_map, "V1ConfigMap", "bad", [k8s_models])


def test_megatron_limits_are_passed_on(exported):
    assert any("gpipe" in u for u in exported["gpt3_gpipe_fp16", "megatron"][1].unsupported)


def test_cli_writes_the_job_and_its_config_map(tmp_path, monkeypatch, capsys):
    from _cli import run_cli
    from advisor.plan import save_plan

    plan = tmp_path / "plan.json"
    save_plan(plans()["llama8b_torchtitan_sac"], plan)
    code, _, err = run_cli(monkeypatch, capsys, "export", str(plan), "--to", "k8s")
    assert code == 2 and "needs --image IMAGE" in err and "Traceback" not in err
    out = tmp_path / "job.yaml"
    code, _, err = run_cli(monkeypatch, capsys, "export", str(plan), "--to", "k8s", "--image", IMAGE, "--out", str(out))
    assert code == 0, err
    config_map, job = [d for d in yaml.safe_load_all(out.read_text())]
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert _pod(job)["containers"][0]["image"] == IMAGE
    assert "note: torchtitan.toml keeps torchtitan's defaults" in err
    code, _, err = run_cli(monkeypatch, capsys, "export", str(plan), "--to", "torchtitan", "--image", IMAGE)
    assert code == 2 and "--image goes with --to k8s" in err
