"""Kubernetes: a Kubeflow PyTorchJob (kubeflow.org/v1) that runs the plan with torchrun, on the framework it
was priced for.

Manifest fields follow the Kubeflow Training Operator v1 API (KubeflowOrgV1PyTorchJob:
spec.pytorchReplicaSpecs.{Master,Worker}.{replicas,restartPolicy,template}, spec.nprocPerNode,
spec.runPolicy; the container must be named "pytorch") and core/v1 PodTemplateSpec. With nprocPerNode
set, the operator gives every pod PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT, which torchrun reads as defaults for its options.

The job launches the plan's framework (``training.framework``; ``--framework`` names another, and the export
then says what was priced differently), each as its own export writes it:

* Megatron-LM: pretrain_gpt.py with the flags of the megatron export (advisor.export.megatron) for the same
  --target-version. The image is the NGC PyTorch container that release's README names, and an init
  container checks out that release's tag of NVIDIA/Megatron-LM into a shared volume, so the flags and the
  code always belong to the same release (pretrain_gpt.py imports megatron from its own folder).
* torchtitan: ``torchrun -m torchtitan.train --job.config_file`` (torchtitan's run_train.sh) with the job TOML
  of the torchtitan export; the TOML is the whole configuration here, so a model without a torchtitan
  flavor (which would train torchtitan's default debugmodel) is refused.
* DeepSpeed: the user's train.py with ``--deepspeed --deepspeed_config`` (deepspeed.add_config_arguments) and
  the files of the deepspeed export (ds_config.json, pipeline_settings.py, the model's config.json). torchrun
  replaces DeepSpeed's own ssh launcher: deepspeed.init_distributed reads torchrun's environment.

The files a job reads come from a ConfigMap, written first in the same YAML file (``kubectl apply -f`` takes
both) and mounted read-only at CONFIG_DIR. torchtitan and DeepSpeed publish no training image, so their jobs
need ``--image``: one with that release installed (and, for DeepSpeed, train.py in its working folder).
MindSpore plans get a MindSpore Operator job (advisor.export.k8s_mindspore). The plain PyTorch record
(FSDP2/DDP as llm-foundry runs it) has no launcher here and is refused with the ways to get one.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Callable

import yaml

from advisor.errors import AdvisorError
from advisor.export import ExportResult
from advisor.export import deepspeed, torchtitan
from advisor.export._common import comment_block, device_resource, display, header_lines, procs_per_node
from advisor.export import megatron
from advisor.export.megatron import DEFAULT_VERSION, SCRIPT, VERSIONS, megatron_launch
from advisor.export.torchtitan_flavors import flavor_of
from advisor.plan import Plan
from advisor.specs.frameworks import FRAMEWORKS

MEGATRON_DIR = "/workspace/megatron-lm"
MEGATRON_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
CONFIG_DIR = "/etc/advisor"          # where the ConfigMap's files are mounted in every pod
MANIFEST = "pytorchjob.yaml"
# an image reference: registry/path:tag or @digest, nothing a shell or YAML would read otherwise
IMAGE_PATTERN = re.compile(r"[a-z0-9][a-z0-9._\-/:@]{0,254}", re.IGNORECASE)


def job_name(plan: Plan) -> str:
    raw = f"{plan.model.name}-{plan.cluster.devices}x-{plan.hardware.name}"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return name[:63].rstrip("-") or "advisor-job"


@dataclass(frozen=True)
class PodLaunch:
    """What every pod of the job runs: one framework at one release."""

    framework: str
    """The framework record launched (advisor.specs.frameworks)."""
    version: str
    """Its release, as --target-version names it."""
    image: str
    command: tuple[str, ...]
    """The container's command: torchrun and its training script or module with their arguments."""
    nproc_per_node: int
    env: tuple[tuple[str, str], ...] = ()
    config_files: tuple[tuple[str, str], ...] = ()
    """(file name, text) mounted from the job's ConfigMap at CONFIG_DIR."""
    init_containers: tuple[dict, ...] = ()
    volumes: tuple[dict, ...] = ()
    """Volumes beyond /dev/shm and the ConfigMap, mounted in the training container at each one's mountPath."""
    unsupported: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _torchrun(plan: Plan, nproc: int) -> list[str]:
    return ["torchrun", "--nnodes", str(plan.cluster.nodes), "--nproc-per-node", str(nproc)]


def _device_note(plan: Plan, image: str, given: bool) -> list[str]:
    """What the image must do for a device that is not NVIDIA's: ours (NVIDIA's container) does not run there."""
    resource = device_resource(plan)
    if resource == "nvidia.com/gpu":
        return []
    if given:
        return [f"{display(plan.hardware.device.name)}: devices are requested as {resource}; image {image} must carry "
                "torch_npu and the framework's Ascend port"]
    return [f"{display(plan.hardware.device.name)}: image {image} is NVIDIA's and does not run on this device; replace "
            f"it with one that carries torch_npu and the framework's Ascend port; devices are requested as {resource}"]


def _needs_image(framework: str, version: str, contents: str) -> AdvisorError:
    title = FRAMEWORKS[framework].title
    return AdvisorError(f"--to k8s: {title} publishes no training image, so the job needs --image IMAGE: an image "
                        f"with {title} {version} installed{contents}")


def megatron_pod(plan: Plan, version: str | None, image: str | None) -> PodLaunch:
    launch = megatron_launch(plan, version)
    release = VERSIONS[launch.version]
    given = image is not None
    image = image or release.container
    whose = "the one given" if given else f"the container Megatron-Core {launch.version} names"
    notes = list(launch.notes)
    notes += _device_note(plan, image, given) or [
        f"image {image} is {whose}; the init container clones {release.git_tag} of Megatron-LM with its git (the "
        "pods need access to github.com)"]
    fetch = {
        "name": "fetch-megatron",
        "image": image,
        "command": ["git", "clone", "--depth", "1", "--branch", release.git_tag, MEGATRON_REPO, MEGATRON_DIR],
        "volumeMounts": [{"name": "megatron", "mountPath": MEGATRON_DIR}],
    }
    return PodLaunch(
        framework=megatron.FRAMEWORK, version=launch.version, image=image, nproc_per_node=launch.nproc_per_node,
        command=(*_torchrun(plan, launch.nproc_per_node), f"{MEGATRON_DIR}/{SCRIPT}", *launch.args()),
        env=tuple(launch.env.items()), init_containers=(fetch,),
        volumes=({"name": "megatron", "emptyDir": {}, "mountPath": MEGATRON_DIR},),
        unsupported=tuple(launch.unsupported), notes=tuple(notes))


def torchtitan_pod(plan: Plan, version: str | None, image: str | None) -> PodLaunch:
    result = torchtitan.export(plan, version)
    version = version or torchtitan.DEFAULT_VERSION
    if flavor_of(plan.model) is None:
        raise AdvisorError(f"--to k8s: torchtitan ships no flavor of {display(plan.model.name)}, and the job's TOML is "
                           "its whole configuration, so torchtitan would train its default debugmodel; register the "
                           "priced architecture as a flavor in your image and launch the torchtitan export's TOML")
    if image is None:
        raise _needs_image("torchtitan", version, "")
    unsupported: list[str] = []
    nproc = procs_per_node(plan, "torchrun", unsupported)
    (name, text), = result.files.items()
    notes = list(result.notes) + _device_note(plan, image, True) + [
        f"{name} keeps torchtitan's defaults for what the plan does not choose: [training] dataset (c4_test) and "
        "[model] hf_assets_path (the tokenizer) point into torchtitan's source tree; set dataset_path and "
        "hf_assets_path to your data and tokenizer in the ConfigMap"]
    return PodLaunch(
        framework="torchtitan", version=version, image=image, nproc_per_node=nproc,
        command=(*_torchrun(plan, nproc), "-m", "torchtitan.train", "--job.config_file", f"{CONFIG_DIR}/{name}"),
        config_files=((name, text),), unsupported=(*result.unsupported, *unsupported), notes=tuple(notes))


def deepspeed_pod(plan: Plan, version: str | None, image: str | None) -> PodLaunch:
    result = deepspeed.export(plan, version)
    version = version or deepspeed.DEFAULT_VERSION
    if image is None:
        raise _needs_image("deepspeed", version, " and your train.py in its working folder (DeepSpeed trains the "
                           "model your script builds)")
    unsupported: list[str] = []
    nproc = procs_per_node(plan, "torchrun", unsupported)
    files = tuple((n, t) for n, t in result.files.items() if not n.endswith(".sh"))   # torchrun is the launcher
    notes = list(result.notes) + _device_note(plan, image, True) + [
        f"train.py is yours, in the image's working folder: it reads --deepspeed_config {CONFIG_DIR}/ds_config.json, "
        f"and finds pipeline_settings.py (PYTHONPATH) and the model's config.json in {CONFIG_DIR}"]
    return PodLaunch(
        framework="deepspeed", version=version, image=image, nproc_per_node=nproc,
        command=(*_torchrun(plan, nproc), "train.py", "--deepspeed", "--deepspeed_config",
                 f"{CONFIG_DIR}/ds_config.json"),
        env=(("PYTHONPATH", CONFIG_DIR),), config_files=files,
        unsupported=(*result.unsupported, *unsupported), notes=tuple(notes))


# framework -> (what its pods run, its releases, the default one); each keyed by its export's FRAMEWORK
POD_LAUNCHES: dict[str, tuple[Callable[[Plan, str | None, str | None], PodLaunch], tuple[str, ...], str]] = {
    megatron.FRAMEWORK: (megatron_pod, tuple(VERSIONS), DEFAULT_VERSION),
    torchtitan.FRAMEWORK: (torchtitan_pod, tuple(torchtitan.VERSIONS), torchtitan.DEFAULT_VERSION),
    deepspeed.FRAMEWORK: (deepspeed_pod, tuple(deepspeed.VERSIONS), deepspeed.DEFAULT_VERSION),
}
FRAMEWORK = megatron.FRAMEWORK   # whose releases VERSIONS lists: a plan searched for one Megatron-Core release
VERSIONS = VERSIONS              # gets that release's job; --target-version names the launched framework's release
DEFAULT_VERSION = DEFAULT_VERSION
JOB_FRAMEWORKS = (*POD_LAUNCHES, "mindspore")     # what --framework takes with --to k8s


def launched(plan: Plan, framework: str | None) -> str:
    """The framework the job runs: as asked (--framework), else the plan's own."""
    name = plan.training.framework if framework is None else framework
    if name in JOB_FRAMEWORKS:
        return name
    if framework is not None:
        raise AdvisorError(f"--framework with --to k8s takes {', '.join(JOB_FRAMEWORKS)}, got {display(name[:20])!r}")
    raise AdvisorError(
        f"--to k8s: the plan was priced for {FRAMEWORKS[name].title} (FSDP2/DDP as llm-foundry runs it), which no "
        f"job here launches; price it for torchtitan, PyTorch's own FSDP2 and DTensor trainer (advisor estimate "
        f"--plan PLAN --framework torchtitan --out PLAN2), or name the job's framework with --framework")


def check_image(image: str | None) -> None:
    if image is not None and not IMAGE_PATTERN.fullmatch(image):
        raise AdvisorError(f"--image: {display(image[:80])!r} is not an image reference (registry/name:tag or "
                           "name@sha256:digest: letters, digits and . _ - / : @, at most 255 characters)")


def manifests(plan: Plan, pod: PodLaunch) -> list[dict]:
    """The ConfigMap (when the job reads files) and the PyTorchJob."""
    resource = device_resource(plan)
    nproc = pod.nproc_per_node
    name = job_name(plan)
    config_map = f"{name[:56].rstrip('-')}-config"
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    for volume in pod.volumes:
        mounts.append({"name": volume["name"], "mountPath": volume["mountPath"]})
        volumes.append({k: v for k, v in volume.items() if k != "mountPath"})
    if pod.config_files:
        mounts.append({"name": "advisor-config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "advisor-config", "configMap": {"name": config_map}})

    def replica(count: int) -> dict:
        container = {
            "name": "pytorch",
            "image": pod.image,
            "imagePullPolicy": "IfNotPresent",
            "command": list(pod.command),
            "resources": {"limits": {resource: str(nproc)}, "requests": {resource: str(nproc)}},
            "volumeMounts": copy.deepcopy(mounts),
        }
        if pod.env:
            container["env"] = [{"name": k, "value": v} for k, v in pod.env]
        spec: dict = {}
        if pod.init_containers:
            spec["initContainers"] = copy.deepcopy(list(pod.init_containers))
        spec["containers"] = [container]
        spec["volumes"] = copy.deepcopy(volumes)
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": spec}}

    specs = {"Master": replica(1)}
    if plan.cluster.nodes > 1:
        specs["Worker"] = replica(plan.cluster.nodes - 1)
    labels = {"app.kubernetes.io/created-by": "advisor"}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "nprocPerNode": str(nproc),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
            "pytorchReplicaSpecs": specs,
        },
    }
    if not pod.config_files:
        return [job]
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config_map, "labels": dict(labels)},
             "data": dict(pod.config_files)}, job]


class _Dumper(yaml.SafeDumper):
    """yaml.SafeDumper writing a file's text (a ConfigMap value) as a literal block, as people write them."""


def _text(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def dump(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=120)


def export(plan: Plan, target_version: str | None = None, framework: str | None = None,
           image: str | None = None) -> ExportResult:
    """The job for ``framework`` (default: the plan's) at ``target_version`` (that framework's release)."""
    name = launched(plan, framework)
    check_image(image)
    if name == "mindspore":
        from advisor.export import k8s_mindspore

        if image is not None:
            raise AdvisorError("--image goes with a PyTorchJob; the MindSpore Operator job takes MindSpore's image")
        return k8s_mindspore.export(plan, target_version)
    build, versions, default = POD_LAUNCHES[name]
    if target_version is not None and target_version not in versions:
        raise AdvisorError(f"--target-version: the k8s export of a {FRAMEWORKS[name].title} job supports "
                           f"{', '.join(versions)} (default {default}), not {display(target_version[:20])!r}")
    pod = build(plan, target_version, image)
    docs = manifests(plan, pod)
    title = f"Kubeflow PyTorchJob running {FRAMEWORKS[name].title} {pod.version}"
    text = (comment_block(header_lines(plan, title))
            + f"# kubectl apply -f {MANIFEST}   (needs the Kubeflow Training Operator"
            + ("; the ConfigMap comes first)\n" if len(docs) > 1 else ")\n")
            + dump(docs))
    return ExportResult(target="k8s", files={MANIFEST: text}, unsupported=pod.unsupported, notes=pod.notes)


__all__ = ["export", "launched", "manifests", "PodLaunch", "POD_LAUNCHES", "JOB_FRAMEWORKS", "job_name"]
