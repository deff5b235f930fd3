"""Transcribe the defaults of the dataclasses a Megatron-Bridge run_config.yaml serialises into
advisor/importers/_bridge_defaults.py (read by advisor.importers.megatron_bridge).

The defaults are read from the source with ``ast`` (no Megatron code is imported or run): a field's default when it
is a literal (or ``field(default=literal)``); a field whose default is computed (``default_factory``, a function
call, an enum, a dtype) is recorded as UNKNOWN, which the importer treats as "no default to compare with".

Sources (mirrors fetched with the tool library's ``fetch``):
  Megatron-LM  tag core_v0.15.0: megatron/core/{model_parallel_config.py, transformer/transformer_config.py,
               distributed/distributed_data_parallel_config.py, optimizer/optimizer_config.py}
  Megatron-Bridge tag v0.2.0 (25.11; pyproject: megatron-core >=0.15.0a0,<0.16.0):
               src/megatron/bridge/{models/gpt_provider.py, training/config.py, training/mixed_precision.py,
               training/comm_overlap.py}

Usage: python benchmarks/transcribe_bridge_defaults.py [MEGATRON_LM_GIT_DIR] [MEGATRON_BRIDGE_GIT_DIR]
"""

from __future__ import annotations

import ast
import pprint
import subprocess
import sys
from pathlib import Path

MLM_TAG, BRIDGE_TAG = "core_v0.15.0", "v0.2.0"
# ConfigContainer section -> the classes whose fields it holds, each over the ones before: (repository, file, class).
# The latent-attention fields (MLATransformerConfig) come first, so that a GPT model's shared fields keep
# TransformerConfig's defaults (multi_latent_attention False) and only the MLA-only fields come from it.
SECTIONS = {
    "model": [("mlm", "megatron/core/transformer/transformer_config.py", "MLATransformerConfig"),
              ("mlm", "megatron/core/model_parallel_config.py", "ModelParallelConfig"),
              ("mlm", "megatron/core/transformer/transformer_config.py", "TransformerConfig"),
              ("bridge", "src/megatron/bridge/models/gpt_provider.py", "GPTModelProvider")],
    "ddp": [("mlm", "megatron/core/distributed/distributed_data_parallel_config.py", "DistributedDataParallelConfig"),
            ("bridge", "src/megatron/bridge/training/config.py", "DistributedDataParallelConfig")],
    "optimizer": [("mlm", "megatron/core/optimizer/optimizer_config.py", "OptimizerConfig"),
                  ("bridge", "src/megatron/bridge/training/config.py", "OptimizerConfig")],
    "train": [("bridge", "src/megatron/bridge/training/config.py", "TrainingConfig")],
    "dist": [("bridge", "src/megatron/bridge/training/config.py", "DistributedInitConfig")],
    "mixed_precision": [("bridge", "src/megatron/bridge/training/mixed_precision.py", "MixedPrecisionConfig")],
    "comm_overlap": [("bridge", "src/megatron/bridge/training/comm_overlap.py", "CommOverlapConfig")],
}
UNKNOWN = "<computed>"


def _show(git_dir: str, tag: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{tag}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _default(node: ast.expr | None):
    if node is None:
        return None, False                   # a field without a default: required, nothing to compare with
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return _default(kw.value)
        return UNKNOWN, True
    try:
        return ast.literal_eval(node), True
    except ValueError:
        return UNKNOWN, True


def fields_of(source: str, name: str) -> dict:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            out = {}
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    value, has = _default(stmt.value)
                    if not stmt.target.id.startswith("_"):
                        out[stmt.target.id] = value if has else UNKNOWN
            return out
    raise SystemExit(f"class {name} not found")


def main() -> None:
    if any(a.startswith("-") for a in sys.argv[1:]):
        raise SystemExit(__doc__)
    mlm = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/NVIDIA+Megatron-LM/repo"
    bridge = sys.argv[2] if len(sys.argv) > 2 else "/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo"
    repos = {"mlm": (mlm, MLM_TAG), "bridge": (bridge, BRIDGE_TAG)}
    defaults = {}
    for section, classes in SECTIONS.items():
        merged: dict = {}
        for repo, path, cls in classes:
            git_dir, tag = repos[repo]
            merged.update(fields_of(_show(git_dir, tag, path), cls))
        defaults[section] = dict(sorted(merged.items()))
    out = Path(__file__).resolve().parents[1] / "advisor" / "importers" / "_bridge_defaults.py"
    header = ('"""Field defaults of the dataclasses a Megatron-Bridge run_config.yaml serialises, by ConfigContainer '
              'section.\n\nGenerated by benchmarks/transcribe_bridge_defaults.py from Megatron-LM '
              f'{MLM_TAG} and Megatron-Bridge\n{BRIDGE_TAG} (see that script for the files); '
              f'"{UNKNOWN}" marks a default computed at run time. Do not edit.\n"""\n\n')
    body = f"UNKNOWN = {UNKNOWN!r}\n\nDEFAULTS = " + pprint.pformat(defaults, width=116, sort_dicts=False) + "\n"
    out.write_text(header + body)
    print(f"wrote {out}: " + ", ".join(f"{k} {len(v)}" for k, v in defaults.items()))


if __name__ == "__main__":
    main()
