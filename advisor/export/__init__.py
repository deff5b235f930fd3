"""Exports: turn a plan (plan JSON) into the launch configuration of a framework people already use.

One module per target. Each exporter is a function ``(plan) -> ExportResult``: the files it writes
(name -> text) and, as sentences naming the plan field, every plan feature the target cannot express
(``unsupported``). The CLI prints those on stderr; nothing is dropped silently. Exporters read only
the plan (model, hardware, cluster, training, parallel), never the cost model or the searchers.

Targets and the vocabulary each one is checked against (tests/test_export_*.py):

* ``megatron``   Megatron-LM ``pretrain_gpt.py`` flags (megatron/training/arguments.py)
* ``deepspeed``  ``ds_config.json`` (DeepSpeedConfig) plus the pipeline settings (PipelineModule)
* ``torchtitan`` the [parallelism], [training] and [activation_checkpoint] sections of torchtitan 0.2
* ``mindspore``  ``mindspore.set_auto_parallel_context`` and a MindFormers parallel_config YAML
* ``k8s``        a Kubeflow ``PyTorchJob`` (kubeflow.org/v1) that runs the plan with torchrun
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.plan import Plan

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


def _exporter(target: str) -> Callable[[Plan], ExportResult]:
    module = importlib.import_module(f"advisor.export.{target}")
    return module.export


def export_plan(plan: Plan, target: str) -> ExportResult:
    """Export one plan to one target (one of TARGETS)."""
    if target not in TARGETS:
        raise AdvisorError(f"--to: unknown export target {target!r} (choose one of: {', '.join(TARGETS)})")
    result = _exporter(target)(plan)
    if plan.operator_strategies:
        searcher = (plan.search or {}).get("searcher", "an operator-level")
        how = ("parallel_mode auto_parallel with search_mode recursive_programming lets MindSpore derive its own"
               if target == "mindspore" and searcher == "drec" else
               "the export uses the plan's uniform degrees")
        result = replace(result, unsupported=result.unsupported + (
            f"operator_strategies: the per-operator shardings found by the {searcher} searcher are not written out "
            f"({target} takes uniform degrees); {how}",))
    return result


def write_export(result: ExportResult, out: str | Path) -> list[Path]:
    """Write the files. One file: ``out`` is the file (or an existing folder to put it in). Several
    files: ``out`` is a folder, created when missing. Returns the paths written."""
    out = Path(out)
    written: list[Path] = []
    try:
        if len(result.files) == 1 and not out.is_dir():
            if out.parent and not out.parent.exists():
                raise AdvisorError(f"--out: folder {out.parent} does not exist")
            out.write_text(next(iter(result.files.values())))
            return [out]
        if out.exists() and not out.is_dir():
            raise AdvisorError(f"--out: {out} is a file, but the {result.target} export writes "
                               f"{len(result.files)} files ({', '.join(result.files)}): give a folder")
        out.mkdir(parents=True, exist_ok=True)
        for name, body in result.files.items():
            path = out / name
            path.write_text(body)
            written.append(path)
    except OSError as exc:
        raise AdvisorError(f"--out: cannot write {out}: {exc.strerror}") from None
    return written


def dumps_result(result: ExportResult) -> str:
    return json.dumps(result.to_dict(), indent=2) + "\n"


__all__ = ["TARGETS", "ExportResult", "export_plan", "write_export", "dumps_result"]
