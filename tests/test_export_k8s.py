"""Kubernetes export: a Kubeflow PyTorchJob (kubeflow.org/v1).

With the Kubeflow Training Operator SDK installed (``pip install kubeflow-training``, which brings the
Kubernetes client), every key of the manifest is checked recursively against the SDK's generated
models (KubeflowOrgV1PyTorchJob ... V1Container: their attribute_map is the API's field names and
openapi_types their types). Always, the keys are checked against the fields documented in the
Kubeflow Training Operator PyTorchJob guide and API reference
(https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/ and the kubeflow.org/v1
API: spec.pytorchReplicaSpecs, spec.nprocPerNode, spec.runPolicy, ReplicaSpec replicas/restartPolicy/
template) and the Kubernetes core/v1 PodSpec/Container reference. The torchrun command is parsed by
torch's own torchrun argument parser and its training-script arguments by the Megatron flag table.
"""

from __future__ import annotations

import pytest
import yaml

from _export_plans import plans
from advisor.export import export_plan
from test_export_megatron import megatron_parser

DOC_FIELDS = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "spec": {"pytorchReplicaSpecs", "nprocPerNode", "runPolicy", "elasticPolicy"},
    "runPolicy": {"cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend"},
    "replica": {"replicas", "restartPolicy", "template"},
    "template": {"metadata", "spec"},
    "podSpec": {"initContainers", "containers", "volumes", "nodeSelector", "tolerations", "affinity", "hostNetwork"},
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env", "resources", "volumeMounts"},
    "resources": {"limits", "requests"},
}
REPLICA_TYPES = {"Master", "Worker"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


@pytest.fixture(scope="module")
def exported():
    out = {}
    for name, plan in plans().items():
        result = export_plan(plan, "k8s")
        out[name] = (plan, result, yaml.safe_load(result.files["pytorchjob.yaml"]))
    return out


def test_fields_are_documented(exported):
    for name, (plan, _, doc) in exported.items():
        assert set(doc) <= DOC_FIELDS[""] and doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
        assert set(doc["metadata"]) <= DOC_FIELDS["metadata"]
        spec = doc["spec"]
        assert set(spec) <= DOC_FIELDS["spec"], name
        assert set(spec["runPolicy"]) <= DOC_FIELDS["runPolicy"] and spec["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
        assert set(spec["pytorchReplicaSpecs"]) <= REPLICA_TYPES
        for replica in spec["pytorchReplicaSpecs"].values():
            assert set(replica) <= DOC_FIELDS["replica"] and replica["restartPolicy"] in RESTART_POLICIES
            assert set(replica["template"]) <= DOC_FIELDS["template"]
            pod = replica["template"]["spec"]
            assert set(pod) <= DOC_FIELDS["podSpec"]
            (container,) = pod["containers"]
            assert set(container) <= DOC_FIELDS["container"], name
            assert container["name"] == "pytorch"       # the operator looks for this container name
            for init in pod.get("initContainers", []):
                assert set(init) <= DOC_FIELDS["container"], name
            assert set(container["resources"]) <= DOC_FIELDS["resources"]


def test_nodes_and_processes(exported):
    for name, (plan, _, doc) in exported.items():
        specs = doc["spec"]["pytorchReplicaSpecs"]
        pods = specs["Master"]["replicas"] + specs.get("Worker", {}).get("replicas", 0)
        assert specs["Master"]["replicas"] == 1
        assert pods == plan.cluster.nodes, name
        nproc = int(doc["spec"]["nprocPerNode"])
        container = specs["Master"]["template"]["spec"]["containers"][0]
        resource = "huawei.com/Ascend910" if "Ascend" in plan.hardware.device.name else "nvidia.com/gpu"
        assert container["resources"]["limits"][resource] == str(nproc)
        if plan.cluster.devices % plan.cluster.nodes == 0:
            assert nproc * pods == plan.cluster.devices, name


def test_torchrun_command(exported):
    run = pytest.importorskip("torch.distributed.run")
    parser = megatron_parser()
    for name, (plan, _, doc) in exported.items():
        specs = doc["spec"]["pytorchReplicaSpecs"]
        command = specs["Master"]["template"]["spec"]["containers"][0]["command"]
        assert command[0] == "torchrun"
        ns = run.get_args_parser().parse_args(command[1:])
        assert int(ns.nnodes) == plan.cluster.nodes and int(ns.nproc_per_node) == int(doc["spec"]["nprocPerNode"])
        assert ns.training_script.endswith("pretrain_gpt.py")
        args = parser.parse_args(ns.training_script_args)
        assert args.tensor_model_parallel_size == plan.strategy.tp and args.pipeline_model_parallel_size == plan.strategy.pp
        if "Worker" in specs:
            assert specs["Worker"]["template"]["spec"]["containers"][0]["command"] == command


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

    for name, (_, _, doc) in exported.items():
        _check_against_models(doc, "KubeflowOrgV1PyTorchJob", name, [kf_models, k8s_models])


def test_the_check_catches_a_misspelled_field(exported):
    pytest.importorskip("kubeflow.training")
    import copy

    import kubernetes.client.models as k8s_models
    import kubeflow.training.models as kf_models

    doc = copy.deepcopy(exported["llama8b_dp_drec"][2])
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    with pytest.raises(AssertionError):
        _check_against_models(doc, "KubeflowOrgV1PyTorchJob", "bad", [kf_models, k8s_models])


def test_megatron_limits_are_passed_on(exported):
    assert any("gpipe" in u for u in exported["gpt3_gpipe_fp16"][1].unsupported)
