"""Kubernetes: a Kubeflow PyTorchJob (kubeflow.org/v1) that runs the plan with torchrun.

Manifest fields follow the Kubeflow Training Operator v1 API (KubeflowOrgV1PyTorchJob:
spec.pytorchReplicaSpecs.{Master,Worker}.{replicas,restartPolicy,template}, spec.nprocPerNode,
spec.runPolicy; the container must be named "pytorch") and core/v1 PodTemplateSpec. With nprocPerNode
set, the operator gives every pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT, which torchrun reads as defaults for its options. The container runs Megatron-LM's
pretrain_gpt.py with the flags of the megatron export (advisor.export.megatron) for the same
--target-version: the image is the NGC PyTorch container that release's README names, and an init
container checks out that release's tag of NVIDIA/Megatron-LM into a shared volume, so the flags and
the code always belong to the same release (pretrain_gpt.py imports megatron from its own folder).
"""

from __future__ import annotations

import re

import yaml

from advisor.export import ExportResult
from advisor.export._common import comment_block, device_resource, display, header_lines
from advisor.export.megatron import DEFAULT_VERSION, SCRIPT, VERSIONS, megatron_launch
from advisor.plan import Plan

MEGATRON_DIR = "/workspace/megatron-lm"
MEGATRON_REPO = "https://github.com/NVIDIA/Megatron-LM.git"


def job_name(plan: Plan) -> str:
    raw = f"{plan.model.name}-{plan.cluster.devices}x-{plan.hardware.name}"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return name[:63].rstrip("-")


def manifest(plan: Plan, unsupported: list[str], notes: list[str], target_version: str | None = None) -> dict:
    launch = megatron_launch(plan, target_version)
    release = VERSIONS[launch.version]
    image = release.container
    unsupported.extend(launch.unsupported)
    notes.extend(launch.notes)
    nproc = launch.nproc_per_node
    resource = device_resource(plan)
    if resource != "nvidia.com/gpu":
        notes.append(f"{display(plan.hardware.device.name)}: image {image} is NVIDIA's and does not run on this device; "
                     f"replace it with one that carries torch_npu and MindSpeed (Megatron-LM on Ascend); devices are "
                     f"requested as {resource}")
    else:
        notes.append(f"image {image} is the container Megatron-Core {launch.version} names; the init container "
                     f"clones {release.git_tag} of Megatron-LM (the pods need access to github.com, or use an image "
                     "with it)")
    command = ["torchrun", "--nnodes", str(plan.cluster.nodes), "--nproc-per-node", str(nproc),
               f"{MEGATRON_DIR}/{SCRIPT}", *launch.args()]
    env = [{"name": k, "value": v} for k, v in launch.env.items()]

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": list(command),
            "resources": {"limits": {resource: str(nproc)}, "requests": {resource: str(nproc)}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "megatron", "mountPath": MEGATRON_DIR}],
        }
        fetch = {
            "name": "fetch-megatron",
            "image": image,
            "command": ["git", "clone", "--depth", "1", "--branch", release.git_tag, MEGATRON_REPO, MEGATRON_DIR],
            "volumeMounts": [{"name": "megatron", "mountPath": MEGATRON_DIR}],
        }
        if env:
            container["env"] = [dict(e) for e in env]
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "initContainers": [fetch],
                "containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "megatron", "emptyDir": {}}],
            }},
        }

    specs = {"Master": replica(1)}
    if plan.cluster.nodes > 1:
        specs["Worker"] = replica(plan.cluster.nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job_name(plan), "labels": {"app.kubernetes.io/created-by": "advisor"}},
        "spec": {
            "nprocPerNode": str(nproc),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
            "pytorchReplicaSpecs": specs,
        },
    }


FRAMEWORK = "megatron"   # the framework record this export launches (the PyTorchJob runs Megatron-LM's pretrain_gpt.py)
VERSIONS = VERSIONS                 # --target-version names the Megatron-Core release, as for the megatron export
DEFAULT_VERSION = DEFAULT_VERSION


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    unsupported: list[str] = []
    notes: list[str] = []
    doc = manifest(plan, unsupported, notes, target_version)
    text = (comment_block(header_lines(plan, "Kubeflow PyTorchJob running Megatron-LM"))
            + "# kubectl apply -f pytorchjob.yaml   (needs the Kubeflow Training Operator)\n"
            + yaml.safe_dump(doc, sort_keys=False, width=120))
    return ExportResult(target="k8s", files={"pytorchjob.yaml": text}, unsupported=tuple(unsupported),
                        notes=tuple(notes))
