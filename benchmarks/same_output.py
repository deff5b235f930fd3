"""Do the README's examples and the benchmarks' cases print the same before and after a change?

A refactor (one declaration per setting, framework records, the family registry) must not move a
figure or a word. This script runs a fixed set of commands (every example the README shows, one
estimate per setting and framework, each export of the README's plans, `list`, and the benchmark
scripts whose output does not depend on the machine's speed) and records stdout, stderr, the exit
code and the files each writes. Wall-clock figures (search seconds) are masked.

    python benchmarks/same_output.py --record /tmp/before      # at the old commit
    python benchmarks/same_output.py --compare /tmp/before     # after the change: prints the differences
    python benchmarks/same_output.py --base d1953fd            # both at once (a git worktree of the old commit)

Exit code 0 when every case prints the same, 1 otherwise. ``--only NAME`` runs the cases whose
name contains NAME; ``--list`` names them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (name, argv after "advisor", files the command writes that are compared); cases run in order in one
# folder, so later cases read the plans earlier ones saved.
_PLAN = ["recommend", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "8", "--top", "5", "--out", "plan.json"]
_EST = ["estimate", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "2"]
CASES: list[tuple[str, list[str], list[str]]] = [
    ("list-models", ["list", "models"], []),
    ("list-hardware", ["list", "hardware"], []),
    ("readme-recommend", _PLAN, ["plan.json"]),
    ("readme-recommend-8b", ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"], []),
    ("readme-recommend-ascend-json", ["recommend", "--model", "gpt3-175b", "--hardware", "ascend-910", "--devices",
                                      "1024", "--tokens", "300B", "--json"], []),
    ("readme-time-to-target", ["recommend", "--model", "gpt3-1.3b", "--hardware", "dgx-a100-80g", "--devices", "8",
                               "--objective", "time-to-target", "--target-loss", "2.6"], []),
    ("recommend-cost", ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "4", "--objective",
                        "cost", "--tokens", "1T"], []),
    ("recommend-carbon", ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                          "--objective", "carbon", "--tokens", "1T", "--grid-intensity", "france"], []),
    ("recommend-mindspore", ["recommend", "--model", "pangu-alpha-200b", "--hardware", "ascend-910b", "--devices",
                             "256", "--framework", "mindspore", "--out", "ms.json"], ["ms.json"]),
    ("recommend-moe-fp8", ["recommend", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4",
                           "--dtype", "fp8", "--fp8-recipe", "tensorwise", "--json"], []),
    ("recommend-pins", ["recommend", "--model", "llama3-70b", "--hardware", "dgx-h100", "--nodes", "8", "--tp", "8",
                        "--zero", "1", "--no-offload", "--recompute", "selective", "--framework", "torchtitan"], []),
    ("recommend-nothing-fits", ["recommend", "--model", "llama3-405b", "--hardware", "dgx-a100-40g", "--nodes", "1",
                                "--zero", "0"], []),
    ("recommend-drec", ["recommend", "--model", "gpt3-13b", "--hardware", "dgx-a100-80g", "--nodes", "2",
                        "--searcher", "drec", "--top", "2"], []),
    ("readme-recommend-supernet", ["recommend", "--model", "hat-supernet", "--hardware", "dgx-a100-80g", "--devices",
                                   "4", "--pp", "4", "--out", "supernet.json"], ["supernet.json"]),
    ("readme-recommend-mixed", ["recommend", "--model", "llama3-70b", "--hardware", "dgx-a100-80g:4,dgx-h100:4",
                                "--out", "mixed.json"], ["mixed.json"]),
    ("readme-estimate-mixed", ["estimate", "--plan", "mixed.json"], []),
    ("estimate-mixed-json", ["estimate", "--plan", "mixed.json", "--json"], []),
    ("recommend-mixed-json", ["recommend", "--model", "llama3-8b", "--hardware", "dgx-a100-80g:1,dgx-h100:1",
                              "--json"], []),
    ("readme-recommend-dlrm", ["recommend", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g", "--nodes", "8",
                               "--out", "rec.json"], ["rec.json"]),
    ("recommend-dlrm-json", ["recommend", "--model", "dlrm-criteo-1tb", "--hardware", "dgx-a100-80g", "--nodes", "8",
                             "--ps-mode", "hybrid", "--json"], []),
    ("readme-estimate-wide-deep", ["estimate", "--model", "wide-deep-criteo", "--hardware", "dgx-a100-80g", "--nodes",
                                   "2", "--ps-mode", "hybrid"], []),
    ("estimate-rec-plan-json", ["estimate", "--plan", "rec.json", "--json"], []),
    ("readme-estimate", ["estimate", "--model", "gpt3-175b", "--hardware", "dgx-a100-80g", "--nodes", "8", "--tp", "8",
                         "--pp", "8", "--gbs", "64", "--vpp", "3", "--sequence-parallel", "--recompute", "selective"], []),
    ("readme-estimate-plan-json", ["estimate", "--plan", "plan.json", "--json"], []),
    ("estimate-plan", ["estimate", "--plan", "plan.json"], []),
    ("estimate-supernet-plan", ["estimate", "--plan", "supernet.json", "--json"], []),
    ("estimate-does-not-fit", [*_EST, "--tp", "1", "--pp", "1", "--mbs", "8", "--gbs", "64"], []),
    ("estimate-illegal", [*_EST, "--tp", "3"], []),
]
# one estimate per framework and recomputation, and per setting, on small models (the cost paths that
# branch on them)
for _fw in ("megatron", "pytorch", "torchtitan", "mindspore"):
    for _rc in ("none", "selective", "full"):
        CASES.append((f"estimate-{_fw}-{_rc}", [*_EST, "--framework", _fw, "--recompute", _rc, "--tp", "2", "--pp", "2",
                                                "--zero", "1", "--mbs", "2", "--gbs", "64", "--json"], []))
    CASES.append((f"estimate-{_fw}-math-dropout", [*_EST, "--framework", _fw, "--attention", "math", "--dropout",
                                                   "--recompute", "selective", "--tp", "2", "--gbs", "32"], []))
    CASES.append((f"estimate-{_fw}-moe", ["estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes",
                                          "4", "--framework", _fw, "--tp", "2", "--pp", "2", "--ep", "8", "--zero", "1",
                                          "--recompute", "selective", "--json"], []))
    CASES.append((f"estimate-{_fw}-zero3", [*_EST, "--framework", _fw, "--zero", "3", "--pp", "2", "--gbs", "64",
                                            "--mbs", "2", "--json"], []))
_SETTINGS = [
    ("fp8-delayed", ["--dtype", "fp8"]), ("fp8-mxfp8", ["--dtype", "fp8", "--fp8-recipe", "mxfp8"]),
    ("cp-p2p", ["--cp", "2", "--tp", "2"]), ("cp-a2a", ["--cp", "2", "--cp-comm", "a2a"]),
    ("offload", ["--zero", "1", "--offload-optimizer", "--offload-fraction", "0.5"]),
    ("offload-params", ["--framework", "pytorch", "--zero", "3", "--offload-optimizer", "--offload-params"]),
    ("modules", ["--recompute", "selective", "--recompute-modules", "core_attn,layernorm,mlp"]),
    ("recompute-layers", ["--pp", "2", "--recompute", "full", "--recompute-layers", "3"]),
    ("graphs", ["--cuda-graphs", "attn,mlp"]), ("graphs-full", ["--cuda-graphs", "full"]),
    ("bucket", ["--bucket-mb", "100"]), ("copies", ["--framework", "mindspore", "--tp", "2", "--mbs", "2",
                                                    "--copies", "2"]),
    ("full-batch", ["--framework", "mindspore", "--full-batch"]),
    ("host-embedding", ["--framework", "mindspore", "--pp", "2", "--host-embedding"]),
    ("priority", ["--comm-priority", "--tp", "2"]), ("unfused", ["--framework", "pytorch", "--optimizer-impl", "unfused"]),
    ("unfused-ms", ["--framework", "mindspore", "--optimizer-impl", "unfused", "--pp", "2"]),
    ("gpipe", ["--pp", "4", "--schedule", "gpipe"]), ("vpp", ["--pp", "2", "--vpp", "2", "--gbs", "64"]),
    ("tokens-grid", ["--tokens", "1T", "--grid-intensity", "india", "--pue", "1.2"]),
    ("fp16", ["--dtype", "fp16", "--zero", "2"]), ("fp32", ["--dtype", "fp32", "--tp", "4"]),
]
for _name, _flags in _SETTINGS:
    CASES.append((f"estimate-{_name}", [*_EST, *_flags, "--json"], []))
CASES += [
    ("estimate-moe-token-drop", ["estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4",
                                 "--ep", "8", "--zero", "1", "--moe-token-drop", "--cuda-graphs", "full"], []),
    ("estimate-moe-modules", ["estimate", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--nodes", "4",
                              "--pp", "2", "--ep", "8", "--zero", "1", "--recompute", "selective",
                              "--recompute-modules", "moe_act,core_attn", "--json"], []),
    ("estimate-ascend", ["estimate", "--model", "llama2-7b", "--hardware", "ascend-910b", "--nodes", "1",
                         "--framework", "mindspore", "--recompute", "selective"], []),
    ("estimate-pangu-plan", ["estimate", "--plan", "ms.json"], []),
]
for _target in ("megatron", "deepspeed", "torchtitan", "mindspore", "k8s"):
    CASES.append((f"export-{_target}", ["export", "plan.json", "--to", _target, "--json"], []))
for _target in ("megatron", "mindspore"):
    CASES.append((f"export-ms-plan-{_target}", ["export", "ms.json", "--to", _target, "--json"], []))
CASES += [
    ("export-megatron-text", ["export", "plan.json", "--to", "megatron"], []),
    ("readme-export-rec-mindspore", ["export", "rec.json", "--to", "mindspore", "--json"], []),
    ("readme-export-rec-k8s", ["export", "rec.json", "--to", "k8s", "--framework", "mindspore", "--json"], []),
    ("export-mixed-megatron", ["export", "mixed.json", "--to", "megatron", "--json"], []),
    ("readme-whatif", ["whatif", "--model", "llama3-70b", "--hardware", "dgx-a100-80g,dgx-h100", "--nodes", "8,16,32",
                       "--inter-node-gbps", "25,50", "--tokens", "2T", "--workers", "1"], []),
    ("whatif-json", ["whatif", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1,2", "--workers", "1",
                     "--replace-half", "dgx-a100-80g", "--json"], []),
]
# benchmark scripts whose figures do not depend on the machine's speed (python benchmarks/NAME.py ARGS)
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("accuracy", []),
    ("host_embedding", []),
    ("mindspore_optimizations", []),
]

_MASKS = [
    (re.compile(r'("seconds": )-?[0-9.]+(e-?[0-9]+)?'), r"\1<s>"),
    (re.compile(r"(evaluations\);\s+|\d fit[,;]\s+)[0-9.]+ s\b"), r"\1<s> s"),   # recommend's search summary
    (re.compile(r"(points in )[0-9.]+ ?s\b"), r"\1<s>s"),                          # whatif's summary
    (re.compile(r"\(\d+ s\)"), "(<s> s)"),                                         # accuracy.py's run time
    (re.compile(r"(hosted,\s+)[0-9.]+ s\)"), r"\1<s> s)"),                          # host_embedding.py
    (re.compile(r"(search|refine)(\s+)[0-9.]+ s\b"), r"\1\2<s> s"),                 # mindspore_optimizations.py
]


def _mask(text: str) -> str:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "100"
    env["TERM"] = "dumb"
    env.pop("FORCE_COLOR", None)
    return env


def run_cases(tree: Path, only: str | None) -> dict[str, dict]:
    """Every case's output, run with the advisor package of ``tree``."""
    results: dict[str, dict] = {}
    env = _env(tree)
    with tempfile.TemporaryDirectory(prefix="advisor-same-") as work:
        for name, argv, files in CASES:
            if only and only not in name:
                continue
            proc = subprocess.run([sys.executable, "-m", "advisor", *argv], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=900)
            out = {"argv": argv, "rc": proc.returncode, "stdout": _mask(proc.stdout), "stderr": _mask(proc.stderr)}
            for path in files:
                p = Path(work) / path
                out[f"file {path}"] = _mask(p.read_text()) if p.exists() else None
            results[name] = out
            print(f"  {name}: exit {proc.returncode}", file=sys.stderr)
        for name, args in BENCHMARKS:
            if only and only not in name:
                continue
            proc = subprocess.run([sys.executable, str(tree / "benchmarks" / f"{name}.py"), *args], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=1800)
            results[f"benchmark {name}"] = {"argv": args, "rc": proc.returncode, "stdout": _mask(proc.stdout),
                                            "stderr": _mask(proc.stderr)}
            print(f"  benchmark {name}: exit {proc.returncode}", file=sys.stderr)
    return results


def record(folder: Path, tree: Path, only: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "outputs.json").write_text(json.dumps(run_cases(tree, only), indent=1, sort_keys=True) + "\n")


def compare(before: dict[str, dict], after: dict[str, dict]) -> int:
    """Prints a unified diff per differing case; returns how many differ."""
    differ = 0
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            if old is not None and new is None:
                continue            # not run this time (--only)
            print(f"== {name}: only after")
            differ += 1
            continue
        if old == new:
            continue
        differ += 1
        print(f"== {name} ({' '.join(new['argv'])})")
        for key in sorted(set(old) | set(new)):
            if key == "argv" or old.get(key) == new.get(key):
                continue
            a, b = str(old.get(key)).splitlines(), str(new.get(key)).splitlines()
            print("\n".join(difflib.unified_diff(a, b, f"before {key}", f"after {key}", lineterm="", n=1)))
    total = len(set(before) & set(after))
    print(f"{total - differ} of {total} cases print the same; {differ} differ")
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, help="write the outputs to this folder")
    parser.add_argument("--compare", type=Path, help="compare with the outputs recorded in this folder")
    parser.add_argument("--base", help="a git revision: record it in a temporary worktree, then compare")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--list", action="store_true", help="name the cases")
    args = parser.parse_args()
    if args.list:
        for name, argv, _ in CASES:
            print(f"{name}: advisor {' '.join(argv)}")
        for name, argv in BENCHMARKS:
            print(f"benchmark {name}: python benchmarks/{name}.py {' '.join(argv)}")
        return 0
    if args.record:
        record(args.record, REPO, args.only)
        return 0
    if args.base:
        with tempfile.TemporaryDirectory(prefix="advisor-base-") as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.base], check=True,
                           capture_output=True)
            try:
                before = run_cases(tree, args.only)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
                shutil.rmtree(tree, ignore_errors=True)
    elif args.compare:
        before = json.loads((args.compare / "outputs.json").read_text())
    else:
        parser.error("give --record, --compare or --base")
    return 1 if compare(before, run_cases(REPO, args.only)) else 0


if __name__ == "__main__":
    sys.exit(main())
