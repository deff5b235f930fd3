"""Write advisor/specs/recipes.yaml: the frameworks' published recipes for the bundled models, as measured.

Each measured run of benchmarks/data (Megatron-Bridge's performance tables, torchtitan's benchmark tables,
MindFormers' and llm-foundry's) that is not left out, whose model has the shape of a bundled model, is a
recipe for that model on its profile at its device count, for its framework. Per (model, profile, devices,
framework) the fastest measured run is kept (the best the framework published). `advisor recommend` prices
the recipe's layout under the user's job and prints it beside its #1 (advisor.search.recipes).

    python benchmarks/write_recipes.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.plan_codec import strategy_to_dict  # noqa: E402
from advisor.search.recipes import RECIPES_FILE, shape_key  # noqa: E402
from advisor.specs.model import MODELS_DIR, load_model  # noqa: E402
from advisor.validation.runs import RUNS_FILE, load_runs  # noqa: E402
from advisor.validation.torchtitan import load_torchtitan_runs  # noqa: E402
from advisor.validation.write import write_atomic  # noqa: E402

def bundled_shapes() -> dict[tuple, str]:
    """Shape -> bundled model name (recommendation models and supernets have no transformer shape)."""
    out = {}
    for path in sorted(MODELS_DIR.glob("*.yaml")):
        key = shape_key(load_model(path.stem))
        if key is not None:
            out.setdefault(key, path.stem)
    return out


# torchtitan's rows carry no source key of their own; their file's header names the tables (benchmarks/data)
TORCHTITAN_SOURCES = {"dgx-h100": "pytorch/torchtitan docs/performance.md @ d4c86e37 (Tables 1-6, torchtitan 9dec370)",
                      "dgx-a100-80g": "pytorch/torchtitan docs/performance.md @ 1ea476e9 (FSDP2 on 64 A100 80GB)"}


def sources() -> dict[str, str]:
    """Run id -> its source with release, as benchmarks/data/calibration_runs.yaml gives them."""
    data = yaml.safe_load(RUNS_FILE.read_text())
    out = {}
    for row in data["runs"]:
        release = f", release {row['release']}" if row.get("release") else ""
        commit = f" @ {row['source_commit'][:9]}" if row.get("source_commit") else ""
        out[row["id"]] = f"{row['source']}{commit}{release}"
    return out


def recipes() -> list[dict]:
    shapes = bundled_shapes()
    cited = sources()
    best: dict[tuple, tuple] = {}
    for run in [*load_runs(), *load_torchtitan_runs()]:
        if run.excluded is not None:
            continue
        name = shapes.get(shape_key(run.model))
        if name is None:
            continue
        key = (name, run.profile, run.devices, run.job.framework)
        rank = run.measured_tokens_per_s_per_device
        if key not in best or rank > best[key][0]:
            best[key] = (rank, run)
    out = []
    for (name, profile, devices, framework), (_, run) in sorted(best.items()):
        out.append({"model": name, "hardware": profile, "devices": devices, "framework": framework, "run": run.id,
                    "source": cited.get(run.id) or TORCHTITAN_SOURCES.get(run.profile, run.source), "global_batch_size": run.job.global_batch_size,
                    "seq_length": run.job.seq_length, "dtype": run.job.dtype,
                    "measured_tokens_per_s_per_device": run.measured_tokens_per_s_per_device,
                    "parallel": strategy_to_dict(run.strategy, run.model.num_layers)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the bundled file is not what this writes")
    args = parser.parse_args()
    text = ("# Written by python benchmarks/write_recipes.py from benchmarks/data (each run's source names its table\n"
            "# and release); do not edit by hand.\n" + yaml.safe_dump({"recipes": recipes()}, sort_keys=False, width=120))
    if args.check:
        sys.exit(0 if RECIPES_FILE.read_text() == text else 1)
    write_atomic(RECIPES_FILE, text)
    print(f"wrote {RECIPES_FILE} ({text.count('- model:')} recipes)")


if __name__ == "__main__":
    main()
