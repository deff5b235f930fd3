"""Hostile inputs over every input file and flag (prints tried / clean; not a test).

Generated cases, each run through the command line in this process as a user's shell would see it
(advisor.cli.main, its one error handler included):

* model descriptions: every key of a bundled model set to hostile values (negative, zero, huge, NaN,
  infinity, strings, lists, nested mappings, control characters, octal-looking numbers), keys removed,
  unknown keys, duplicate keys, YAML aliases and merge keys, non-UTF-8 bytes, an empty file;
* hardware profiles: the same over every leaf of a bundled profile;
* plan JSON: every leaf of a recommended plan's parallel, training and model sections, and the document's
  shape (a list, a string, nested a thousand levels);
* Hugging Face config.json and --from files (each importer's format) with hostile values and garbage;
* command-line flags of estimate and recommend: every numeric and choice flag with hostile text; the
  Kubernetes export's --framework, --image and --target-version;
* output paths: a folder that does not exist, a directory, /dev/full, an input file.

A case is clean when the command ends with exit code 0, 1 (a plan that does not fit, said in one line) or 2
(one sentence on stderr), prints no traceback, and finishes within TIMEOUT_S; anything else is listed.

    python benchmarks/hostile.py            # every case
    python benchmarks/hostile.py --quick    # every fifth case
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIMEOUT_S = 60.0
VALUES = [-1, 0, 10 ** 30, 1.5, float("nan"), float("inf"), "text", "", [1, 2], {"a": 1}, True, None,
          "x\u0000y", "\u202etxt", "a" * 5000]
TEXT_FLAG_VALUES = ["-1", "0", "1e309", "nan", "inf", "abc", "", "1" * 400, "\u0661\u0662", "3.5", "0x10"]


def run(args: list[str]) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of advisor ARGS in this process."""
    from advisor import cli

    err, out = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    code = 0
    old = sys.argv
    sys.argv = ["advisor", *args]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                cli.main()
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - a crash past the CLI's handler is the finding
        code = -1
        err.write(f"Traceback (escaped the CLI): {type(exc).__name__}: {exc}")
    finally:
        sys.argv = old
    return code, err.getvalue(), time.perf_counter() - start


def clean(code: int, stderr: str, seconds: float) -> bool:
    return code in (0, 1, 2) and "Traceback" not in stderr and seconds <= TIMEOUT_S


def _dump(path: Path, data, raw: str | bytes | None = None) -> Path:
    if raw is not None:
        path.write_bytes(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
    elif path.suffix == ".json":
        path.write_text(json.dumps(data, allow_nan=True))
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def _leaves(doc, prefix=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(doc, list) and doc and not all(isinstance(x, (int, float, str)) for x in doc):
        for i, v in enumerate(doc):
            yield from _leaves(v, prefix + (i,))
    else:
        yield prefix


def _set(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def _file_cases(folder: Path, name: str, base: dict, suffix: str, command) -> list[tuple[str, list[str]]]:
    """Cases for one input file: every leaf x VALUES, a removed key, an unknown key, and raw texts."""
    cases = []
    for n, path in enumerate(_leaves(base)):
        if not path:
            continue
        for value in VALUES:
            f = _dump(folder / f"{name}-{n}-{len(cases)}{suffix}", _set(base, path, value))
            cases.append((f"{name} {'.'.join(map(str, path))} = {str(value)[:20]!r}", command(f)))
        if isinstance(path[-1], str):
            dropped = copy.deepcopy(base)
            node = dropped
            for k in path[:-1]:
                node = node[k]
            node.pop(path[-1])
            f = _dump(folder / f"{name}-drop-{n}{suffix}", dropped)
            cases.append((f"{name} without {'.'.join(map(str, path))}", command(f)))
    raws = {
        "empty": "", "a list": "[1, 2, 3]", "a string": "just text", "non-UTF-8": b"\xff\xfe\x00garbage",
        "duplicate key": "name: a\nname: b\n", "octal": "num_layers: 040\n",
        "alias bomb": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [" + ", ".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        "merge bomb": "a: &a {x: 1}\n" + "".join(
            f"{c}: &{c}\n  <<: [" + ", ".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        "deep nesting": "[" * 5000 + "]" * 5000, "unknown key": yaml.safe_dump({**base, "zzz_unknown": 1}),
        "control chars": "name: \"a\\u0007b\"\n",
    }
    for label, raw in raws.items():
        f = _dump(folder / f"{name}-raw-{len(cases)}{suffix}", None, raw)
        cases.append((f"{name} {label}", command(f)))
    return cases


def cases(folder: Path) -> list[tuple[str, list[str]]]:
    from advisor.specs.hardware import PROFILES_DIR
    from advisor.specs.model import MODELS_DIR

    model = yaml.safe_load((MODELS_DIR / "llama3-8b.yaml").read_text())
    profile = yaml.safe_load((PROFILES_DIR / "dgx-h100.yaml").read_text())
    out = []
    out += _file_cases(folder, "model", model, ".yaml",
                       lambda f: ["estimate", "--model", str(f), "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8"])
    out += _file_cases(folder, "profile", profile, ".yaml",
                       lambda f: ["estimate", "--model", "llama3-8b", "--hardware", str(f), "--nodes", "1", "--tp", "8"])
    plan_path = folder / "plan.json"
    code, err, _ = run(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1", "--top", "1",
                        "--out", str(plan_path), "--json"])
    if code == 0:
        plan = json.loads(plan_path.read_text())
        small = {k: plan[k] for k in ("parallel", "training")}
        for path in _leaves(small):
            for value in VALUES[:8]:
                doc = copy.deepcopy(plan)
                doc[path[0]] = _set(small, path, value)[path[0]]
                f = _dump(folder / f"plan-{len(out)}.json", doc)
                out.append((f"plan {'.'.join(map(str, path))} = {str(value)[:20]!r}", ["estimate", "--plan", str(f)]))
                out.append((f"export plan {'.'.join(map(str, path))} = {str(value)[:20]!r}",
                            ["export", str(f), "--to", "megatron", "--out", str(folder / f"ex-{len(out)}")]))
        for flag in ("--framework", "--image", "--target-version"):     # the Kubernetes job's choices
            for v in TEXT_FLAG_VALUES + ["pytorch", "a:b;rm -rf /", "img\nname", "torchtitan"]:
                out.append((f"export --to k8s {flag} {v[:20]!r}",
                            ["export", str(plan_path), "--to", "k8s", flag, v, "--out", str(folder / f"k8s-{len(out)}")]))
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
          "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
    out += _file_cases(folder, "config", hf, ".json",
                       lambda f: ["estimate", "--model", str(f), "--hardware", "dgx-h100", "--nodes", "1", "--tp", "8"])
    for label, name, text in (
            ("megatron args", "args.sh", "--tensor-model-parallel-size {v} --pipeline-model-parallel-size 1"),
            ("ds_config", "ds_config.json", '{{"train_batch_size": {v}, "zero_optimization": {{"stage": 1}}}}'),
            ("torchtitan", "job.toml", "[parallelism]\ntensor_parallel_degree = {v}\n"),
            ("mindformers", "run.yaml", "parallel_config:\n  data_parallel: {v}\n  model_parallel: 1\n"),
            ("nemo2", "recipe.yaml", "_target_: nemo.collections.llm.api.pretrain\ntrainer:\n  devices: {v}\n")):
        for v in TEXT_FLAG_VALUES + ["[1]", "{a: 1}", "\"x\""]:
            f = folder / f"{len(out)}-{name}"
            f.write_text(text.format(v=v))
            out.append((f"--from {label} with {v[:20]!r}",
                        ["estimate", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1", "--from", str(f)]))
    base = ["estimate", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"]
    for flag in ("--tp", "--pp", "--cp", "--ep", "--mbs", "--gbs", "--seq-len", "--zero", "--vpp", "--nodes",
                 "--devices", "--memory-margin", "--bucket-mb", "--copies", "--offload-fraction", "--dtype",
                 "--recompute", "--schedule", "--framework", "--framework-release", "--cp-comm", "--attention",
                 "--fp8-recipe", "--stage-layers", "--recompute-modules", "--cuda-graphs", "--tokens", "--pue"):
        for v in TEXT_FLAG_VALUES:
            out.append((f"estimate {flag} {v[:20]!r}", base + [flag, v]))
    rec = ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--nodes", "1"]
    for flag in ("--top", "--searcher", "--objective", "--target-tokens", "--critical-batch-tokens", "--gbs"):
        for v in TEXT_FLAG_VALUES[:6]:
            out.append((f"recommend {flag} {v[:20]!r}", rec + [flag, v]))
    for label, target in (("a missing folder", str(folder / "no" / "such" / "plan.json")), ("a directory", str(folder)),
                          ("/dev/full", "/dev/full"), ("its own input", str(plan_path))):
        out.append((f"recommend --out {label}", rec + ["--out", target]))
        out.append((f"estimate --plan --out {label}", ["estimate", "--plan", str(plan_path), "--out", target]))
        out.append((f"recommend --all-candidates {label}", rec + ["--all-candidates", target]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every fifth case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(Path(tmp))
        if args.quick:
            todo = todo[::5]
        bad, slowest = [], (0.0, "")
        start = time.perf_counter()
        for label, argv in todo:
            code, err, seconds = run(argv)
            slowest = max(slowest, (seconds, label))
            if not clean(code, err, seconds):
                bad.append((label, code, seconds, err.strip().splitlines()[-1][:200] if err.strip() else ""))
        total = time.perf_counter() - start
    for label, code, seconds, last in bad:
        print(f"NOT CLEAN  {label}: exit {code}, {seconds:.1f} s: {last}")
    print(f"{len(todo)} hostile cases tried, {len(todo) - len(bad)} clean, {len(bad)} not; {total:.0f} s in all, "
          f"slowest {slowest[0]:.1f} s ({slowest[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
