"""Kubernetes: a Kubeflow PyTorchJob (kubeflow.org/v1) that runs the plan with torchrun.

Manifest fields follow the Kubeflow Training Operator v1 API (KubeflowOrgV1PyTorchJob:
spec.pytorchReplicaSpecs.{Master,Worker}.{replicas,restartPolicy,template}, spec.nprocPerNode,
spec.runPolicy; the container must be named "pytorch") and core/v1 PodTemplateSpec. With nprocPerNode
set, the operator gives every pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT, which torchrun reads as defaults for its options. The container runs Megatron-LM's
pretrain_gpt.py with the flags of the megatron export (advisor.export.megatron).
"""

from __future__ import annotations

import re

import yaml

from advisor.export import ExportResult
from advisor.export._common import comment_block, header_lines
from advisor.export.megatron import SCRIPT, megatron_launch
from advisor.plan import Plan

IMAGE = "nvcr.io/nvidia/nemo:25.04"          # ships Megatron-LM at /opt/megatron-lm
MEGATRON_DIR = "/opt/megatron-lm"


def device_resource(plan: Plan) -> str:
    """The extended resource a device plugin advertises for the plan's accelerator."""
    name = plan.hardware.device.name.lower()
    if "ascend" in name:
        return "huawei.com/Ascend910"
    return "nvidia.com/gpu"


def job_name(plan: Plan) -> str:
    raw = f"{plan.model.name}-{plan.cluster.devices}x-{plan.hardware.name}"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return name[:63].rstrip("-")


def manifest(plan: Plan, unsupported: list[str], notes: list[str]) -> dict:
    launch = megatron_launch(plan)
    unsupported.extend(launch.unsupported)
    notes.extend(launch.notes)
    nproc = launch.nproc_per_node
    resource = device_resource(plan)
    if resource != "nvidia.com/gpu":
        notes.append(f"{plan.hardware.device.name}: the image must carry torch_npu and MindSpeed (Megatron-LM on Ascend); "
                     f"devices are requested as {resource}")
    command = ["torchrun", "--nnodes", str(plan.cluster.nodes), "--nproc-per-node", str(nproc),
               f"{MEGATRON_DIR}/{SCRIPT}", *launch.args()]
    env = [{"name": k, "value": v} for k, v in launch.env.items()]

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",
            "image": IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": list(command),
            "resources": {"limits": {resource: str(nproc)}, "requests": {resource: str(nproc)}},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }
        if env:
            container["env"] = [dict(e) for e in env]
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
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


def export(plan: Plan) -> ExportResult:
    unsupported: list[str] = []
    notes: list[str] = [f"image {IMAGE} is a default: use one with your Megatron-LM version and data"]
    doc = manifest(plan, unsupported, notes)
    text = (comment_block(header_lines(plan, "Kubeflow PyTorchJob"))
            + "# kubectl apply -f pytorchjob.yaml   (needs the Kubeflow Training Operator)\n"
            + yaml.safe_dump(doc, sort_keys=False, width=120))
    return ExportResult(target="k8s", files={"pytorchjob.yaml": text}, unsupported=tuple(unsupported),
                        notes=tuple(notes))
