"""A Megatron-LM argument list or launch script as advisor's settings (``--from FILE``).

The file is split as bash splits words (shlex, comments dropped); every word starting with ``--`` is a
flag. torchrun's own flags give the cluster (--nnodes, --nproc-per-node); pretrain_gpt.py's flags
(megatron/training/arguments.py, core_v0.13-0.15) are read through the table below: each flag either sets
a setting, states the model's shape (checked against --model), is price-neutral (with the reason), or is
refused with the file, the flag and its value. The export (advisor.export.megatron) writes only flags this
table reads, so an exported plan reads back as itself.
"""

from __future__ import annotations

import shlex
from typing import Any, Callable

from advisor.errors import AdvisorError
from advisor.export.megatron import NORMALIZATIONS, POSITION_EMBEDDINGS, SHARDING_STRATEGIES
from advisor.importers.imported import Imported, where
from advisor.specs.untrusted import prefix

# flags taking no value (argparse store_true / store_false)
SWITCHES = {
    "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-megatron-fsdp", "--use-custom-fsdp", "--no-gradient-accumulation-fusion", "--bf16", "--fp16",
    "--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--tp-comm-overlap", "--fp8-param-gather",
    "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--use-tp-pp-dp-mapping", "--group-query-attention",
    "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--mock-data",
    "--no-create-attention-mask-in-dataloader", "--log-throughput", "--te-rng-tracker", "--external-cuda-graph",
    "--enable-cuda-graph", "--no-check-for-nan-in-loss-and-grad", "--moe-pad-expert-input-to-capacity",
    "--moe-grouped-gemm", "--use-mcore-models", "--use-flash-attn", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--distribute-saved-activations", "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion",
    "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-params-norm", "--log-num-zeros-in-grad",
    "--use-rotary-position-embeddings", "--no-async-tensor-model-parallel-allreduce", "--multi-latent-attention",
}

# price-neutral flags and why (hyper-parameters, data, logging and checkpoints do not change a step's
# time or memory as advisor prices it)
NEUTRAL = {
    **dict.fromkeys(("--lr", "--min-lr", "--lr-decay-style", "--lr-warmup-iters", "--lr-warmup-fraction",
                     "--lr-decay-iters", "--lr-warmup-init", "--weight-decay", "--clip-grad", "--adam-beta1",
                     "--adam-beta2", "--adam-eps", "--init-method-std", "--seed", "--start-weight-decay",
                     "--end-weight-decay", "--weight-decay-incr-style", "--loss-scale", "--initial-loss-scale",
                     "--min-loss-scale", "--loss-scale-window", "--hysteresis", "--sgd-momentum"), "a hyper-parameter"),
    **dict.fromkeys(("--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file",
                     "--data-cache-path", "--num-workers", "--dataloader-type", "--mock-data", "--train-data-path",
                     "--valid-data-path", "--test-data-path"), "the data, not the step"),
    **dict.fromkeys(("--log-interval", "--log-throughput", "--eval-iters", "--eval-interval", "--save", "--load",
                     "--save-interval", "--tensorboard-dir", "--wandb-project", "--wandb-exp-name", "--ckpt-format",
                     "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-params-norm",
                     "--log-num-zeros-in-grad", "--timing-log-level", "--exit-interval", "--exit-duration-in-mins",
                     "--distributed-timeout-minutes", "--train-iters", "--use-mcore-models"),
                    "logging, checkpoints or the run's length, not a step"),
    **dict.fromkeys(("--max-position-embeddings", "--use-precision-aware-optimizer", "--te-rng-tracker",
                     "--no-check-for-nan-in-loss-and-grad", "--no-gradient-accumulation-fusion",
                     "--no-create-attention-mask-in-dataloader", "--moe-grouped-gemm", "--use-rotary-position-embeddings",
                     "--distributed-backend", "--moe-token-dispatcher-type", "--overlap-param-gather",
                     "--use-custom-fsdp", "--use-megatron-fsdp"),
                    "implied by the priced settings (read with the flags they go with)"),
}

TORCHRUN = {"--nnodes", "--nproc-per-node", "--nproc_per_node", "--node-rank", "--node_rank", "--master-addr",
            "--master_addr", "--master-port", "--master_port", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"}

# pretrain_gpt.py flags taking one integer -> (the settings they go to, the field); "model": ModelSpec fields,
# checked against --model
INTEGERS = {
    "--num-layers": ("model", "num_layers"),
    "--hidden-size": ("model", "hidden_size"),
    "--ffn-hidden-size": ("model", "ffn_hidden_size"),
    "--num-attention-heads": ("model", "num_attention_heads"),
    "--vocab-size": ("model", "vocab_size"),
    "--tensor-model-parallel-size": ("strategy", "tp"),
    "--pipeline-model-parallel-size": ("strategy", "pp"),
    "--context-parallel-size": ("strategy", "cp"),
    "--expert-model-parallel-size": ("strategy", "ep"),
    "--num-layers-per-virtual-pipeline-stage": ("strategy", "layers_per_chunk"),
    "--num-virtual-stages-per-pipeline-rank": ("strategy", "virtual_pipeline_stages"),
    "--decoder-first-pipeline-num-layers": ("strategy", "first_stage_layers"),
    "--decoder-last-pipeline-num-layers": ("strategy", "last_stage_layers"),
    "--micro-batch-size": ("strategy", "micro_batch_size"),
    "--global-batch-size": ("job", "global_batch_size"),
    "--seq-length": ("job", "seq_length"),
    "--kv-channels": ("model", "head_dim"),
    "--ddp-bucket-size": ("strategy", "bucket_params"),
    "--num-experts": ("model", "num_experts"),
    "--moe-router-topk": ("model", "top_k"),
    "--moe-ffn-hidden-size": ("model", "expert_ffn_hidden_size"),
    "--moe-shared-expert-intermediate-size": ("model", "shared_ffn"),
    "--q-lora-rank": ("model", "q_lora_rank"),
    "--kv-lora-rank": ("model", "kv_lora_rank"),
    "--qk-head-dim": ("model", "qk_nope_head_dim"),
    "--qk-pos-emb-head-dim": ("model", "qk_rope_head_dim"),
    "--v-head-dim": ("model", "v_head_dim"),
}
# Megatron-LM's MLA defaults (arguments.py, core_v0.13-0.15) for the widths a launch leaves out
MLA_DEFAULTS = {"q_lora_rank": 0, "kv_lora_rank": 32, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
MULTI = {"--recompute-modules", "--cp-comm-type"}      # flags taking a list of words
END = ")"                                              # where a bash array or the command ends

SHARDING = {flag: stage for stage, flag in SHARDING_STRATEGIES.items()}


def _int(flag: str, value: str, source: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise AdvisorError(f"{where(source)}: {flag} takes an integer, got {prefix(value)}") from None
    if out < 0:
        raise AdvisorError(f"{where(source)}: {flag} must not be negative, got {out}")
    return out


def _float(flag: str, value: str, source: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise AdvisorError(f"{where(source)}: {flag} takes a number, got {prefix(value)}") from None
    if out != out or out in (float("inf"), float("-inf")):
        raise AdvisorError(f"{where(source)}: {flag} must be finite, got {prefix(value)}")
    return out


def _words(text: str, source: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise AdvisorError(f"{where(source)}: cannot split it into words as bash would: {exc}") from None


def _flags(words: list[str], source: str) -> list[tuple[str, list[str]]]:
    """(flag, its values) in order: a switch takes none, --recompute-modules and --cp-comm-type the words up to the
    next flag, any other flag the one word after it; the script's other words (commands, bash arrays) are bash's."""
    out: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("--"):
            flag, eq, value = word.partition("=")
            out.append((flag, [value] if eq else []))
            continue
        if word == ")" or word.endswith("=(") or word.endswith("[@]}") or word.endswith("pretrain_gpt.py"):
            out.append((END, []))          # a bash array or the command ends: no flag takes what follows
            continue
        if not out:
            continue
        flag, values = out[-1]
        if flag in MULTI or (flag not in SWITCHES and not values):
            values.append(word)
    return out


def read_megatron(text: str, source: str) -> Imported:
    """The settings a Megatron-LM launch gives (module docstring)."""
    job: dict[str, Any] = {"framework": "megatron", "overlap_grad_reduce": False}
    strategy: dict[str, Any] = {}
    model: dict[str, Any] = {}
    seen: dict[str, list[str]] = {}
    for flag, values in _flags(_words(text, source), source):
        if flag == END:
            continue
        if flag in seen and flag not in TORCHRUN:
            raise AdvisorError(f"{where(source)}: {flag} is given twice")
        seen[flag] = values
        if flag in SWITCHES and values:
            raise AdvisorError(f"{where(source)}: {flag} takes no value, got {prefix(' '.join(values))}")
        if flag not in SWITCHES and flag not in MULTI and len(values) != 1:
            raise AdvisorError(f"{where(source)}: {flag} takes one value, got {prefix(' '.join(values)) or 'none'}")
    nodes = devices = None
    if "--nnodes" in seen:
        nodes = _int("--nnodes", seen["--nnodes"][0], source)
        per = seen.get("--nproc-per-node") or seen.get("--nproc_per_node")
        devices = nodes * _int("--nproc-per-node", per[0], source) if per else None
    for flag, values in seen.items():
        if flag in TORCHRUN or flag in NEUTRAL and flag not in READ:
            continue
        if flag in INTEGERS:
            target, key = INTEGERS[flag]
            {"job": job, "strategy": strategy, "model": model}[target][key] = _int(flag, values[0], source)
            continue
        reader = READ.get(flag)
        if reader is None:
            raise AdvisorError(f"{where(source)}: {flag}{' ' + prefix(' '.join(values)) if values else ''} "
                               "is a flag advisor does not price; remove it or price the run without it")
        reader(values, job, strategy, model, seen, source)
    _derive(job, strategy, model, seen, source)
    return Imported(source=source, framework="megatron", job=job, strategy=strategy, nodes=nodes, devices=devices,
                    model=model)


# ---- what each priced flag sets -------------------------------------------------------------------
Reader = Callable[[list[str], dict, dict, dict, dict, str], None]


def _on(target: str, key: str, value: Any) -> Reader:
    def read(values, job, strategy, model, seen, source):
        {"job": job, "strategy": strategy, "model": model}[target][key] = value
    return read


def _read_elsewhere(values, job, strategy, model, seen, source):
    """Read together with the flag it goes with."""


def _choice(target: str, key: str, flag: str, choices: dict[str, Any]) -> Reader:
    def read(values, job, strategy, model, seen, source):
        if values[0] not in choices:
            raise AdvisorError(f"{where(source)}: {flag} {prefix(values[0])} is not a value advisor prices "
                               f"({', '.join(choices)})")
        {"job": job, "strategy": strategy, "model": model}[target][key] = choices[values[0]]
    return read


def _dtype(values, job, strategy, model, seen, source):
    job.setdefault("dtype", "bf16" if "--bf16" in seen else "fp16")


def _fp8(values, job, strategy, model, seen, source):
    job["dtype"] = "fp8"
    recipe = (seen.get("--fp8-recipe") or ["delayed"])[0]
    job["fp8_recipe"] = recipe


def _fp4(values, job, strategy, model, seen, source):
    """--fp4-format e2m1 (--fp4-recipe nvfp4, its only choice): the linear layers' GEMMs in NVFP4."""
    job["dtype"] = "fp8"
    job["fp8_recipe"] = "nvfp4"


def _distributed_optimizer(values, job, strategy, model, seen, source):
    strategy.setdefault("zero_stage", 1)          # ZeRO-1, unless Megatron FSDP's sharding strategy says more


def _sharding(values, job, strategy, model, seen, source):
    if values[0] not in SHARDING:
        raise AdvisorError(f"{where(source)}: --data-parallel-sharding-strategy {prefix(values[0])} is none of "
                           f"{', '.join(SHARDING)}")
    strategy["zero_stage"] = SHARDING[values[0]]


def _recompute(values, job, strategy, model, seen, source):
    kind = values[0]
    if kind not in ("full", "selective"):
        raise AdvisorError(f"{where(source)}: --recompute-granularity {prefix(kind)} is neither full nor selective")
    strategy["recompute"] = kind
    method = (seen.get("--recompute-method") or [None])[0]
    count = seen.get("--recompute-num-layers")
    if kind == "full" and method == "block" and count:
        strategy["recompute_layers_per_chunk"] = _int("--recompute-num-layers", count[0], source)
    elif kind == "full" and method not in ("uniform", None):
        raise AdvisorError(f"{where(source)}: --recompute-method {prefix(str(method))} is neither uniform nor block")


def _modules(values, job, strategy, model, seen, source):
    job["recompute_modules"] = ",".join(values)


def _attention_backend(values, job, strategy, model, seen, source):
    backend = values[0]
    if backend not in ("flash", "fused", "auto", "unfused"):
        raise AdvisorError(f"{where(source)}: --attention-backend {prefix(backend)} is not priced (flash, fused, "
                           "auto or unfused)")
    job["attention"] = "math" if backend == "unfused" else "flash"


def _dropout(values, job, strategy, model, seen, source):
    rates = [_float(f, seen[f][0], source) for f in ("--attention-dropout", "--hidden-dropout") if f in seen]
    job["dropout"] = any(r > 0 for r in rates) if len(rates) == 2 else True   # Megatron's default: 0.1 / 0.1


def _cp_comm(values, job, strategy, model, seen, source):
    if len(values) != 1 or values[0] not in ("p2p", "a2a"):
        raise AdvisorError(f"{where(source)}: --cp-comm-type {prefix(' '.join(values))} is not priced (p2p or a2a)")
    strategy["cp_comm"] = values[0]


def _offload_fraction(values, job, strategy, model, seen, source):
    strategy["offload_fraction"] = _float("--optimizer-offload-fraction", values[0], source)


def _kv(values, job, strategy, model, seen, source):
    model["num_kv_heads"] = _int("--num-query-groups", values[0], source)


def _pattern(text: str, flag: str, source: str) -> list[int] | int:
    """A layer pattern as Megatron's moe_freq_type takes it: an integer, or a list expression of 0/1 lists joined
    by + and repeated by *, e.g. "([0]*3+[1]*58)" or "([1]+[0])*12", parsed without evaluating any code."""
    s = text.replace(" ", "")
    if s.isdigit():
        return int(s)
    pos = 0

    def fail():
        raise AdvisorError(f"{where(source)}: {flag} {prefix(text)} is not an integer or a list pattern of 0 and 1 "
                           "joined by + and repeated by *")

    def number() -> int:
        nonlocal pos
        start = pos
        while pos < len(s) and s[pos].isdigit():
            pos += 1
        if start == pos or pos - start > 6:
            fail()
        return int(s[start:pos])

    def term() -> list[int]:
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            out = expr()
            if pos >= len(s) or s[pos] != ")":
                fail()
            pos += 1
        elif pos < len(s) and s[pos] == "[":
            pos += 1
            out = []
            while pos < len(s) and s[pos] != "]":
                out.append(number())
                if pos < len(s) and s[pos] == ",":
                    pos += 1
            if pos >= len(s):
                fail()
            pos += 1
        else:
            fail()
        while pos < len(s) and s[pos] == "*":
            pos += 1
            out = out * number()
            if len(out) > 100_000:
                fail()
        return out

    def expr() -> list[int]:
        nonlocal pos
        out = term()
        while pos < len(s) and s[pos] == "+":
            pos += 1
            out = out + term()
        return out

    result = expr()
    if pos != len(s) or any(x not in (0, 1) for x in result):
        fail()
    return result


def _layer_pattern(flag: str, key: str) -> Reader:
    def read(values, job, strategy, model, seen, source):
        model[key] = _pattern(values[0], flag, source)
    return read


def _window(values, job, strategy, model, seen, source):
    parts = values[0].strip("()").split(",")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts) or int(parts[1]) != 0 \
            or int(parts[0]) < 1:
        raise AdvisorError(f"{where(source)}: --window-size {prefix(values[0])}: advisor prices a causal window of "
                           "W keys to the left, written W,0")
    model["sliding_window"] = int(parts[0])


def _capacity(values, job, strategy, model, seen, source):
    job["moe_dropless"] = False


def _layout(values, job, strategy, model, seen, source):
    """--pipeline-model-parallel-layout as the export writes it: stages of chunk 0, then chunk 1, ... separated by
    '|', each E (embedding), t or t*N (N layers) and L (loss)."""
    parts = values[0].split("|")
    counts = []
    for part in parts:
        body = part.replace("E", "").replace("L", "")
        if body == "":
            counts.append(0)
        elif body == "t" * len(body):
            counts.append(len(body))
        elif body.startswith("t*") and body[2:].isdigit():
            counts.append(int(body[2:]))
        else:
            raise AdvisorError(f"{where(source)}: --pipeline-model-parallel-layout part {prefix(part)} is not "
                               "of the form E, t, t*N or L (write the layout out stage by stage)")
    strategy["layout"] = counts


READ: dict[str, Reader] = {
    "--sequence-parallel": _on("strategy", "sequence_parallel", True),
    "--pipeline-model-parallel-layout": _layout,
    "--use-distributed-optimizer": _distributed_optimizer,
    "--data-parallel-sharding-strategy": _sharding,
    "--overlap-grad-reduce": _on("job", "overlap_grad_reduce", True),
    "--optimizer-cpu-offload": _on("strategy", "offload_optimizer", True),
    "--optimizer-offload-fraction": _offload_fraction,
    "--bf16": _dtype,
    "--fp16": _dtype,
    "--fp8-format": _fp8,
    "--fp8-recipe": _read_elsewhere,              # read with --fp8-format
    "--fp4-format": _fp4,
    "--fp4-recipe": _read_elsewhere,              # nvfp4, its only choice (Megatron-Core 0.15 arguments.py)
    "--grad-reduce-in-bf16": _on("job", "grad_reduce_dtype", "bf16"),
    "--accumulate-allreduce-grads-in-fp32": _on("job", "grad_reduce_dtype", "fp32"),
    "--tp-comm-overlap": _on("job", "tp_comm_overlap", True),
    "--fp8-param-gather": _on("job", "fp8_param_gather", True),
    "--recompute-granularity": _recompute,
    "--recompute-method": _read_elsewhere,        # read with --recompute-granularity
    "--recompute-num-layers": _read_elsewhere,
    "--recompute-modules": _modules,
    "--attention-backend": _attention_backend,
    "--use-flash-attn": _on("job", "attention", "flash"),
    "--attention-dropout": _dropout,
    "--hidden-dropout": _dropout,
    "--cp-comm-type": _cp_comm,
    "--use-tp-pp-dp-mapping": _on("strategy", "mesh_order", ("dp", "pp", "cp", "tp")),
    "--expert-tensor-parallel-size": _read_elsewhere,   # read in _derive, with the tensor-parallel size
    "--multi-latent-attention": _read_elsewhere,         # read in _derive, with its ranks and widths
    "--moe-layer-freq": _layer_pattern("--moe-layer-freq", "moe_layer_pattern"),
    "--window-size": _window,
    "--window-attn-skip-freq": _layer_pattern("--window-attn-skip-freq", "window_pattern"),
    "--num-query-groups": _kv,
    "--group-query-attention": _read_elsewhere,   # read with --num-query-groups
    "--account-for-embedding-in-pipeline-split": _on("strategy", "account_embedding", True),
    "--account-for-loss-in-pipeline-split": _on("strategy", "account_loss", True),
    "--moe-expert-capacity-factor": _capacity,
    "--moe-pad-expert-input-to-capacity": _read_elsewhere,
    "--optimizer": _choice("job", "optimizer", "--optimizer", {"adam": "adamw", "sgd": "sgd"}),
    # the model's form, checked against --model
    "--position-embedding-type": _choice("model", "position_embedding", "--position-embedding-type",
                                         {flag: value for value, flag in POSITION_EMBEDDINGS.items()}),
    "--normalization": _choice("model", "norm", "--normalization", {flag: value for value, flag in NORMALIZATIONS.items()}),
    "--swiglu": _on("model", "ffn_activation", "swiglu"),
    "--untie-embeddings-and-output-weights": _on("model", "tie_embeddings", False),
    "--disable-bias-linear": _on("model", "use_bias", False),
}


def _derive(job: dict, strategy: dict, model: dict, seen: dict, source: str) -> None:
    """Settings that need several flags: the model's defaults where Megatron's differ, the layers per stage and
    virtual stages, recomputed layers, the MoE block, the bucket."""
    if "--swiglu" not in seen and "--ffn-hidden-size" in seen:
        model.setdefault("ffn_activation", "gelu")          # Megatron-LM's default activation
    if "--untie-embeddings-and-output-weights" not in seen and "--num-layers" in seen:
        model.setdefault("tie_embeddings", True)
    if "--disable-bias-linear" not in seen and "--num-layers" in seen:
        model.setdefault("use_bias", True)
    if "--bf16" not in seen and "--fp16" not in seen and "dtype" not in job:
        job["dtype"] = "fp32"
    if "--attention-dropout" not in seen and "--hidden-dropout" not in seen:
        job["dropout"] = True                     # Megatron-LM's defaults, 0.1 and 0.1
    if "--recompute-granularity" in seen and "--recompute-modules" not in seen and strategy.get("recompute") == "selective":
        job["recompute_modules"] = "core_attn"    # Megatron-Core's default module
    if "--num-experts" in seen and "--moe-expert-capacity-factor" not in seen:
        job["moe_dropless"] = True
    if "--expert-tensor-parallel-size" in seen:      # Megatron's default is the tp size; 1 folds the experts
        etp, tp = _int("--expert-tensor-parallel-size", seen["--expert-tensor-parallel-size"][0], source), strategy.get("tp", 1)
        if etp not in (1, tp):
            raise AdvisorError(f"{where(source)}: --expert-tensor-parallel-size {etp}: advisor prices the experts split "
                               f"over the tensor-parallel size ({tp}) or whole (1, MoE parallel folding)")
        if etp == 1 and tp > 1:
            strategy["fold_experts"] = True
    moe = {k: model.pop(k) for k in ("num_experts", "top_k", "expert_ffn_hidden_size", "shared_ffn") if k in model}
    if moe:
        moe.setdefault("shared_ffn", 0)           # no --moe-shared-expert-intermediate-size: no shared expert
        model["moe"] = moe
    mla = {k: model.pop(k) for k in MLA_DEFAULTS if k in model}
    if "--multi-latent-attention" in seen:
        model["mla"] = {**MLA_DEFAULTS, **mla}
    elif mla:
        raise AdvisorError(f"{where(source)}: {', '.join(f for f, (_, k) in INTEGERS.items() if k in mla)} without "
                           "--multi-latent-attention: the attention is not latent")
    elif "--num-attention-heads" in seen:
        model["mla"] = None
    if "--window-size" in seen:
        model.setdefault("window_pattern", None)   # every layer windowed unless a skip frequency says otherwise
    elif "--num-attention-heads" in seen:
        model["sliding_window"] = None
    if "num_kv_heads" not in model and "--num-attention-heads" in seen:
        model["num_kv_heads"] = model["num_attention_heads"]
