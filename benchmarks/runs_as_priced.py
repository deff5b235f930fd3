"""Plans that run as priced: what the framework runs, searched and exported; measured runs accepted.

Two figures of the "runs as priced" issue:

1. For each bundled setting x every framework with an export (megatron, deepspeed, torchtitan, mindspore),
   `recommend --framework F` and the #1 plan's `export --to F`: how many export with nothing the target
   cannot run (the export would otherwise exit 2), how many notes the export adds (placeholders the
   plan does not choose: learning rate, data paths, host names), and whether the exported file read back
   with `estimate --from` (Megatron-LM and torchtitan) prices the same.
2. Every usable run of ../shared/validation that advisor.validation prices: how many break no legality
   rule of advisor.space.rules under their own framework (what `advisor estimate` checks), and which do.

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
    clean = total = read = same = 0
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
            for item in result.unsupported:
                print(f"  {model} {fw}: {item[:160]}", file=sys.stderr)
        print(f"{f'{model} on {devices} x {hardware}':44} " + " ".join(f"{c:>14}" for c in cells))
    print(f"exported as priced: {clean} of {total} (n: notes, placeholders the plan does not choose); read back "
          f"with --from at the same price: {same} of {read} (=; != differs; megatron and torchtitan have importers)")


IMPORTED = {"megatron": "megatron_pretrain_gpt.sh", "torchtitan": "torchtitan.toml"}


def _reimported(model: str, hardware: str, plan, result) -> bool | None:
    """Whether the export, read back with --from (advisor.importers), prices the same (None: no importer)."""
    import tempfile

    from advisor.commands.estimate_request import estimate_request

    name = IMPORTED.get(result.target)
    if name is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_text(result.files[name])
        back = estimate_request(model, hardware, None, plan.cluster.devices, job={}, strategy={}, launch=str(path))
    return abs(back.estimate.tokens_per_s / plan.prediction["tokens_per_s"] - 1) < 1e-9


def runs_table() -> None:
    from advisor.space.rules import broken_rules
    from advisor.specs.job import Cluster
    from advisor.validation.accuracy import run_hardware, usable_runs

    runs = usable_runs()
    refused: Counter = Counter()
    for run in runs:
        hw = run_hardware(run)
        cluster = Cluster(nodes=max(1, run.devices // hw.node.devices_per_node), devices=run.devices)
        for name, sentence in broken_rules(run.model, cluster, run.job, run.strategy)[:1]:
            refused[name] += 1
            print(f"  refused {run.id}: {sentence[:150]}")
    print(f"measured runs the rules accept: {len(runs) - sum(refused.values())} of {len(runs)}"
          + (f" (refused: {', '.join(f'{k} {v}' for k, v in refused.items())})" if refused else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three settings instead of ten")
    args = parser.parse_args()
    export_table(SETTINGS[:3] if args.quick else SETTINGS)
    runs_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
