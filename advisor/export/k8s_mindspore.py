"""Kubernetes: a MindSpore Operator job (MSJob) for a recommendation plan.

Fields follow mindspore-ai/ms-operator (pkg/apis/v1/msjob_types.go: apiVersion
mindspore.gitee.com/v1, kind MSJob, spec.runPolicy, spec.successPolicy, spec.msReplicaSpecs keyed by
replica type Scheduler / PS / Worker, each a kubeflow common ReplicaSpec {replicas, restartPolicy,
template}; config/samples/ms_wide_deep_ps_distribute.yaml: container "mindspore", one GPU per worker
pod, successPolicy AllWorkers). Every job gets one Scheduler: MindSpore's dynamic cluster starts the
Workers (and Parameter Servers) and "an additional Scheduler" that does the networking and runs no
training code (tutorials/source_en/parallel/dynamic_cluster.md in mindspore-ai/docs). A PS or hybrid
plan adds ``servers`` PS replicas; every plan has one Worker per device. Every pod runs the training script of the
mindspore export (advisor.export.mindspore_ps) with its role in MS_ROLE and the counts in
MS_SERVER_NUM / MS_WORKER_NUM; the operator wires the scheduler's address. The manifest is written
with yaml.safe_dump; no plan string reaches a command.
"""

from __future__ import annotations

import re

import yaml

from advisor.export import ExportResult
from advisor.export._common import device_resource, display
from advisor.export.mindspore_ps import asynchronous_unsupported
from advisor.plan import Plan

IMAGE = "swr.cn-south-1.myhuaweicloud.com/mindspore/mindspore-gpu:2.2.0"   # a MindSpore GPU image (replace)
# the Ascend image of MindSpore's docker install guide (install/mindspore_ascend_install_docker_en.md:
# swr.cn-south-1.myhuaweicloud.com/mindspore/mindspore-ascend:{tag}), tagged with the 2.7.1 release
ASCEND_IMAGE = "swr.cn-south-1.myhuaweicloud.com/mindspore/mindspore-ascend:2.7.1"
TRAIN_COMMAND = "python -s train.py"                                       # the user's script (replace)

FRAMEWORK = "mindspore"   # the framework record this export launches (the MSJob runs MindFormers)


def job_name(plan: Plan) -> str:
    raw = f"{plan.model.name}{'-ps' if plan.parameter_server is not None else ''}-{plan.cluster.devices}x"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return name[:63].rstrip("-") or "advisor-msjob"


def image(plan: Plan) -> str:
    return ASCEND_IMAGE if device_resource(plan).startswith("huawei.com/") else IMAGE


def _replica(count: int, role: str, plan: Plan, device: bool) -> dict:
    ps = plan.parameter_server
    env = [{"name": "MS_ROLE", "value": role}, {"name": "MS_WORKER_NUM", "value": str(plan.cluster.devices)}]
    if ps is not None:
        env.append({"name": "MS_SERVER_NUM", "value": str(ps["servers"])})
    container = {"name": "mindspore", "image": image(plan), "imagePullPolicy": "IfNotPresent",
                 "command": ["/bin/bash", "-c", TRAIN_COMMAND], "env": env}
    if device:
        resource = device_resource(plan)
        container["resources"] = {"limits": {resource: 1}}
    return {"replicas": count, "restartPolicy": "Never", "template": {"spec": {"containers": [container]}}}


def manifest(plan: Plan) -> dict:
    ps = plan.parameter_server
    specs: dict = {"Scheduler": _replica(1, "MS_SCHED", plan, device=False)}
    if ps is not None:
        specs["PS"] = _replica(int(ps["servers"]), "MS_PSERVER", plan, device=False)
    specs["Worker"] = _replica(plan.cluster.devices, "MS_WORKER", plan, device=True)
    return {
        "apiVersion": "mindspore.gitee.com/v1",
        "kind": "MSJob",
        "metadata": {"name": job_name(plan), "labels": {"app.kubernetes.io/created-by": "advisor"}},
        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "successPolicy": "AllWorkers", "msReplicaSpecs": specs},
    }


def export(plan: Plan, target_version: str | None = None) -> ExportResult:
    ps = plan.parameter_server
    script = "imports ps_context.py" if ps is not None else "sets the parallel context"
    notes = [f"image {image(plan)} and command {TRAIN_COMMAND!r} are placeholders: use your MindSpore image (its "
             f"version matching the devices' driver) and the training script that {script} of "
             "'advisor export --to mindspore'"]
    if ps is not None and ps["server_placement"] == "colocated":
        notes.append("co-located servers: add pod affinity so that each PS pod shares a node with Worker pods")
    head = (f"# advisor plan -> MindSpore Operator MSJob (advisor {display(plan.advisor_version)})\n"
            f"# model {display(plan.model.name)} on {plan.cluster.devices} devices"
            + (f", {ps['mode']} with {ps['servers']} parameter servers\n" if ps is not None else ", collective only\n")
            + "# kubectl apply -f msjob.yaml   (needs mindspore-ai/ms-operator)\n")
    text = head + yaml.safe_dump(manifest(plan), sort_keys=False, width=120)
    return ExportResult(target="k8s", files={"msjob.yaml": text}, notes=tuple(notes),
                        unsupported=tuple(asynchronous_unsupported(plan)))
