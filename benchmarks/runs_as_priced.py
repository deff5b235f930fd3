"""Plans that run as priced: what the framework runs, searched and exported; measured runs accepted.

Two figures of the "runs as priced" issue:

1. For each bundled setting x every framework with an export (megatron, deepspeed, torchtitan, mindspore),
   `recommend --framework F` and the #1 plan's `export --to F`: how many export with nothing the target
   cannot run (the export would otherwise exit 2), how many notes the export adds (placeholders the
   plan does not choose: learning rate, data paths, host names), and whether the exported files read back
   with `estimate --from` (every target has an importer) price the same. The same plan's Kubernetes job
   (`export --to k8s`, with `--image` where the framework publishes none) launches that framework: how many
   of those jobs launch it as priced.
2. Every run of ../shared/validation that advisor.validation prices (usable calibration runs and published
   runs), entered on the command line as `advisor estimate` flags: how many it accepts at the validation's
   price, which it refuses and why; and how many runs that really ran are judged not to fit.

    python benchmarks/runs_as_priced.py            # both tables
    python benchmarks/runs_as_priced.py --quick    # three settings instead of ten

Run from the repository root. Prints the tables; exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.commands.inputs import resolve_inputs  # noqa: E402
from advisor.commands.recommend import recommend  # noqa: E402
from advisor.errors import AdvisorError  # noqa: E402
from advisor.export import export_plan  # noqa: E402
from advisor.export.hf_model import FILE as MODEL_FILE  # noqa: E402
from advisor.search import Pins  # noqa: E402

FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "mindspore")   # each is its own export target
SETTINGS = (
    ("llama3-8b", "dgx-h100", 8), ("llama3-8b", "dgx-h100", 64), ("llama3-70b", "dgx-h100", 64),
    ("llama3-70b", "dgx-a100-80g", 128), ("gpt3-175b", "dgx-a100-80g", 512), ("mixtral-8x7b", "dgx-h100", 64),
    ("llama2-7b", "dgx-a100-80g", 16), ("qwen3-30b-a3b", "dgx-h100", 32), ("llama3-405b", "dgx-h100", 512),
    ("pangu-alpha-13b", "ascend-910b", 32),
)


def export_table(settings) -> None:
    print(f"{'setting':44} " + " ".join(f"{f:>14}" for f in FRAMEWORKS))
    clean = total = read = same = jobs = jobs_clean = 0
    for model, hardware, devices in settings:
        cells = []
        for fw in FRAMEWORKS:
            try:
                i = resolve_inputs(model, hardware, devices=devices, framework=fw)
                plan = recommend(i.model, i.hardware, i.cluster, i.job, pins=Pins(), top_k=1).plans[0]
            except AdvisorError as exc:
                cells.append("no plan")
                print(f"  {model} {fw}: {str(exc)[:120]}", file=sys.stderr)
                continue
            result = export_plan(plan, fw)
            total += 1
            clean += not result.unsupported
            back = _reimported(model, hardware, plan, result) if not result.unsupported else None
            if back is not None:
                read += 1
                same += back
            cells.append(f"{'ok' if not result.unsupported else 'REFUSED'} {len(result.notes)}n"
                         + ("" if back is None else " =" if back else " !="))
            jobs += 1
            try:     # the Kubernetes job of the same plan launches its framework
                job = export_plan(plan, "k8s", image=None if fw in ("megatron", "mindspore") else K8S_IMAGE)
                jobs_clean += not job.unsupported
                for item in job.unsupported:
                    print(f"  {model} {fw} k8s: {item[:160]}", file=sys.stderr)
            except AdvisorError as exc:
                print(f"  {model} {fw} k8s: {str(exc)[:160]}", file=sys.stderr)
            for item in result.unsupported:
                print(f"  {model} {fw}: {item[:160]}", file=sys.stderr)
        print(f"{f'{model} on {devices} x {hardware}':44} " + " ".join(f"{c:>14}" for c in cells))
    print(f"exported as priced: {clean} of {total} (n: notes, placeholders the plan does not choose); read back "
          f"with --from at the same price: {same} of {read} (=; != differs)")
    print(f"Kubernetes jobs (--to k8s) launching the plan's framework as priced: {jobs_clean} of {jobs}")


K8S_IMAGE = "registry.example.com/team/trainer:1.0"   # --image for the frameworks that publish no image

# the file each export's --from reads (the DeepSpeed script and the MindFormers YAML read the files beside them)
IMPORTED = {"megatron": "megatron_pretrain_gpt.sh", "torchtitan": "torchtitan.toml",
            "deepspeed": "launch_deepspeed.sh", "mindspore": "mindformers_parallel.yaml"}


def _reimported(model: str, hardware: str, plan, result) -> bool | None:
    """Whether the export, read back with --from (advisor.importers), prices the same (None: no importer)."""
    import tempfile

    from advisor.commands.estimate_request import estimate_request

    name = IMPORTED.get(result.target)
    if name is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        for file, text in result.files.items():
            (Path(folder) / file).write_text(text)
        path = Path(folder) / name
        # an export that writes the architecture (DeepSpeed's config.json) is read back with it, not the bundled name
        described = Path(folder) / MODEL_FILE
        back = estimate_request(str(described) if described.exists() else model, hardware, None, plan.cluster.devices,
                                job={}, strategy={}, launch=str(path))
    return abs(back.estimate.tokens_per_s / plan.prediction["tokens_per_s"] - 1) < 1e-9


def runs_table() -> None:
    """Every measured run advisor.validation prices, entered as `advisor estimate` flags (advisor.validation.cli_check)."""
    from advisor.validation.cli_check import check_all
    from advisor.validation.accuracy import predict, usable_runs

    checks = check_all()
    for c in checks:
        if not c.as_priced:
            shown = "priced differently" if c.why is None else c.why[:150]
            print(f"  not as priced {c.run_id}: {shown}")
    print(f"measured runs advisor estimate accepts at the validation price: {sum(c.as_priced for c in checks)} of "
          f"{len(checks)} (calibration and published runs, entered as command-line flags)")
    judged = [p for p in map(predict, usable_runs()) if not p.fits]
    print(f"measured runs judged not to fit in device memory: {len(judged)}"
          + (f" ({', '.join(p.run.id for p in judged)})" if judged else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three settings instead of ten")
    args = parser.parse_args()
    export_table(SETTINGS[:3] if args.quick else SETTINGS)
    runs_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
