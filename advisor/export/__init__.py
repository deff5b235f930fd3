"""Exports: turn a plan (plan JSON) into the launch configuration of a framework people already use.

One module per target. Each exporter is a function ``(plan) -> ExportResult``: the files it writes
(name -> text) and, as sentences naming the plan field, every plan feature the target cannot express
(``unsupported``), and the notes a user must act on (placeholders, mock data, images). The CLI prints
both on stderr; nothing is dropped silently. Every plan string that reaches a file is escaped for its
syntax (shlex for bash, repr for Python, TOML basic strings, yaml.safe_dump; comment lines through
_common.display), so a hand-written plan cannot put code into an export. Exporters read only
the plan (model, hardware, cluster, training, parallel), never the cost model or the searchers.

Targets and the vocabulary each one is checked against (tests/test_export_*.py):

* ``megatron``   Megatron-LM ``pretrain_gpt.py`` flags (megatron/training/arguments.py)
* ``deepspeed``  ``ds_config.json`` (DeepSpeedConfig) plus the pipeline settings (PipelineModule)
* ``torchtitan`` the [parallelism], [training] and [activation_checkpoint] sections of a torchtitan 0.2.x job TOML
* ``mindspore``  ``mindspore.set_auto_parallel_context`` and a MindFormers parallel_config YAML
* ``k8s``        a Kubeflow ``PyTorchJob`` (kubeflow.org/v1) that runs the plan's framework with torchrun
                 (Megatron-LM, torchtitan, DeepSpeed), or a MindSpore Operator ``MSJob`` for MindSpore plans
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.export._common import display
from advisor.families import family_of_model, resolve
from advisor.plan import Plan
from advisor.space.rules import FRAMEWORK_RULES, broken_rules
from advisor.specs.frameworks import FRAMEWORKS

TARGETS = ("megatron", "deepspeed", "torchtitan", "mindspore", "k8s")


@dataclass(frozen=True)
class ExportResult:
    """What one exporter produced. ``files`` keeps its order: the first file is the main one."""

    target: str
    files: dict[str, str]
    unsupported: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def main_file(self) -> str:
        return next(iter(self.files))

    def text(self) -> str:
        """All files as one text (each under a '# ==> name <==' line when there are several)."""
        if len(self.files) == 1:
            return next(iter(self.files.values()))
        parts = []
        for name, body in self.files.items():
            parts.append(f"# ==> {name} <==\n{body}")
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "files": dict(self.files), "unsupported": list(self.unsupported),
                "notes": list(self.notes)}


def _exporter(target: str) -> Callable[..., ExportResult]:
    module = importlib.import_module(f"advisor.export.{target}")
    return module.export


def supported_versions(target: str) -> tuple[tuple[str, ...], str]:
    """(the releases a target's export can write for, the default one)."""
    module = importlib.import_module(f"advisor.export.{target}")
    return tuple(module.VERSIONS), module.DEFAULT_VERSION


def export_plan(plan: Plan, target: str, target_version: str | None = None, launch=None,
                k8s_framework: str | None = None, image: str | None = None) -> ExportResult:
    """Export one plan to one target (one of TARGETS) for one release of it (None: the target's
    DEFAULT_VERSION; each target module has a VERSIONS table and refuses others with AdvisorError).
    ``launch`` (advisor.export.mindspore_launch.LaunchOptions: the nodes' hosts and the master port)
    goes to the mindspore target's launchers; the other targets take none. ``k8s_framework`` names the framework
    a Kubernetes job launches (default: the plan's; advisor.export.k8s.launched) and ``image`` its container
    image."""
    if target not in TARGETS:
        raise AdvisorError(f"--to: unknown export target {target[:20]!r} (choose one of: {', '.join(TARGETS)})")
    if (k8s_framework is not None or image is not None) and target != "k8s":
        flag = "--framework" if k8s_framework is not None else "--image"
        raise AdvisorError(f"{flag} goes with --to k8s (the framework and image of the Kubernetes job), not "
                           f"--to {target[:20]}")
    if launch is not None and target != "mindspore":
        raise AdvisorError(f"--hosts and --master-port go with --to mindspore (its msrun, mpirun and rank-table "
                           f"launchers), not --to {target[:20]}")
    from advisor.export._mixed import check_mixed

    fam = family_of_model(plan.model)
    if fam.exporters is not None and target not in fam.exporters:
        raise AdvisorError(fam.export_refusal.format(model=plan.model.name, target=target))
    mixed_notes = check_mixed(plan, target)
    release = plan.training.framework_release
    if target_version is None and release is not None:      # written for the release the plan was searched for
        module = importlib.import_module(f"advisor.export.{target}")
        if module.FRAMEWORK == plan.training.framework and release in getattr(module, "VERSIONS", ()) and \
                k8s_framework in (None, plan.training.framework):
            target_version = release
    if fam.exporters is not None:             # the family's own exporter (advisor.families)
        runs = getattr(importlib.import_module(fam.exporters[target].split(":")[0]), "FRAMEWORK", None)
        if image is not None or k8s_framework not in (None, runs):
            raise AdvisorError(f"--framework and --image choose a transformer plan's Kubernetes job; "
                               f"{display(plan.model.name[:40])!r} is exported by its family's own job (give neither)")
        result = resolve(fam.exporters[target])(plan, target_version)
        framework = runs or plan.training.framework
    else:
        if target == "k8s":        # the job launches the plan's framework, or the one asked for
            k8s = importlib.import_module("advisor.export.k8s")
            framework = k8s.launched(plan, k8s_framework)
            result = k8s.export(plan, target_version, framework=framework, image=image)
        else:
            framework = importlib.import_module(f"advisor.export.{target}").FRAMEWORK
            result = _exporter(target)(plan, target_version, launch) if launch is not None else \
                _exporter(target)(plan, target_version)
        result = replace(result, unsupported=runs_as_priced(plan, framework) + result.unsupported)
    if mixed_notes:
        result = replace(result, notes=result.notes + mixed_notes)
    if plan.strategy.swap_layers is not None and not FRAMEWORKS[framework].activation_swap:
        result = replace(result, unsupported=result.unsupported + (
            f"parallel.swap_layers = {list(plan.strategy.swap_layers)}: {FRAMEWORKS[framework].title} has no per-layer "
            "activation swap" + (f" ({FRAMEWORKS[framework].activation_swap_absent})"
                                 if FRAMEWORKS[framework].activation_swap_absent else "")
            + "; exported without it, so the activations will not fit as priced",))
    written = target == "mindspore" and isinstance(plan.operator_strategies, dict) and "strategies" in plan.operator_strategies
    if plan.operator_strategies and not written:   # mindspore writes them (advisor/export/mindspore_strategy.py)
        searcher = (plan.search or {}).get("searcher", "an operator-level")
        how = ("parallel_mode auto_parallel with search_mode recursive_programming lets MindSpore derive its own"
               if target == "mindspore" and searcher == "drec" else
               "the export uses the plan's uniform degrees")
        result = replace(result, unsupported=result.unsupported + (
            f"operator_strategies: the per-operator shardings found by the {searcher} searcher are not written out "
            f"({target} takes uniform degrees); {how}",))
    return result


def runs_as_priced(plan: Plan, framework: str) -> tuple[str, ...]:
    """What keeps the launch of ``framework`` from running the plan as priced, as sentences naming the plan
    field: a plan priced for another framework (its kernels, limits and defaults), and every legality rule the
    plan breaks under ``framework``'s record (advisor.space.rules, the rules the search and estimate apply)."""
    priced = plan.training.framework
    out = []
    if priced != framework:
        out.append(f"training.framework = {priced}: the plan was priced for {FRAMEWORKS[priced].title}, and this "
                   f"export launches {FRAMEWORKS[framework].title}; price it for {framework} first (advisor estimate "
                   f"--plan PLAN --framework {framework} --out PLAN2, or advisor recommend --framework {framework})")
    try:
        job = replace(plan.training, framework=framework)     # the job's own checks for that framework
    except AdvisorError as exc:
        return (*out, f"training.framework = {framework}: {str(exc).removeprefix('training: ')}")
    out += [f"parallel.{FRAMEWORK_RULES.get(name, 'strategy')}: {sentence}"
            for name, sentence in broken_rules(plan.model, plan.cluster, job, plan.strategy)]
    return tuple(out)


def write_export(result: ExportResult, out: str | Path) -> list[Path]:
    """Write the files. One file: ``out`` is the file (or an existing folder to put it in). Several
    files: ``out`` is a folder, created when missing. Returns the paths written."""
    from advisor.runtime.files import write_atomic

    out = Path(out)
    written: list[Path] = []
    try:
        if len(result.files) == 1 and not out.is_dir():
            if out.parent and not out.parent.exists():
                raise AdvisorError(f"--out: folder {out.parent} does not exist")
            write_atomic(out, next(iter(result.files.values())), what="the export")
            return [out]
        if out.exists() and not out.is_dir():
            raise AdvisorError(f"--out: {out} is a file, but the {result.target} export writes "
                               f"{len(result.files)} files ({', '.join(result.files)}): give a folder")
        out.mkdir(parents=True, exist_ok=True)
        for name, body in result.files.items():
            path = out / name
            write_atomic(path, body, what="the export")   # each file whole, or the previous one kept
            written.append(path)
    except OSError as exc:
        raise AdvisorError(f"--out: cannot write {out}: {exc.strerror}") from None
    return written


def dumps_result(result: ExportResult) -> str:
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


__all__ = ["TARGETS", "ExportResult", "export_plan", "write_export", "dumps_result"]
