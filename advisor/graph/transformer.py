"""The operator graph of a transformer model description (GPT, Llama, MoE), for one micro-batch.

Operators and labels (b batch, s sequence, h hidden, g key/value heads, r query heads per key/value
head, d head dimension, t key positions, f FFN hidden, v vocabulary, e experts, c expert capacity):

    embed     tokens[b,s], wte[v,h] (, wpe[s,h])      -> x[b,s,h]           vocabulary-parallel lookup
    ln1       x[b,s,h]                                -> n1[b,s,h]          h not cut (as Megatron)
    qkv       n1[b,s,h], wq[h,g,r,d], wkv[h,g,2,d]    -> q[b,s,g,r,d], kv[b,s,g,2,d]   (GQA: g < heads)
    attn      q[b,s,g,r,d], kv[b,t,g,2,d]             -> ctx[b,s,g,r,d]     scores and context batched
                                                                              matmuls, softmax, dropout;
                                                                              t not cut, so a cut of s
                                                                              gathers K and V (context
                                                                              parallelism, all-gather form)
    proj      ctx[b,s,g,r,d], wo[g,r,d,h]             -> o[b,s,h]           row-parallel when g is cut
    res1      o, x, bias                              -> x1[b,s,h]          bias-dropout-add
    ln2, fc1 (with the GELU, or gated SwiGLU with two matrices), fc2, res2 likewise; MoE layers
    replace fc1/fc2 by router[b,s,e], dispatch (all-to-all when e is cut where b was), expert
    matmuls over [e,b,c,h], and combine.
    lnf, head x[b,s,h] @ w[h,v] -> logits[b,s,v] (fp32), loss (cross entropy: a cut of v all-reduces
    three fp32 statistics per token, Megatron's vocabulary-parallel cross entropy).

FLOPs: 2mnk per matmul (Narayanan et al. SC'21, appendix); attention's two batched matmuls cost
2 * b * s * s * h each (the whole s x s product, as Megatron counts). Saved activations follow
Korthikanti et al. 2022 (section 4.1) tensor by tensor: each operator saves its inputs (and the
attention scores, softmax and dropout outputs, 5 bytes per score at 16 bits, or with flash
attention (the job's default) only an fp32 log-sum-exp per query and head; dropout masks 1 byte per
element; the GELU input, or SwiGLU's gate/up output), which adds up to sbh(34 + 5as/h) per layer
without parallelism for math attention. Without dropout (the job's ``dropout``, off by default) no
masks are kept and the scores are the softmax output alone: sbh(32 + 2as/h) at 16 bits, as
advisor.cost.activations counts it.

Dense and MoE layers are two templates, each listed once with ``count`` = its number of layers;
links carry each layer's output to the next layer's input (as often as that transition occurs).
"""

from __future__ import annotations

import math

from advisor.errors import AdvisorError
from advisor.graph.graph import Link, Operator, OperatorGraph, Tensor
from advisor.specs.job import TrainingJob
from advisor.specs.model import ModelSpec

INT_BYTES = 4
FP32 = 4
MASK_BYTES = 1


class _Builder:
    def __init__(self, model: ModelSpec, job: TrainingJob, batch: int):
        self.m = model
        self.B = batch
        self.S = job.seq_length
        self.dt = job.dtype_bytes
        self.attention = getattr(job, "attention", "math")     # math | flash
        self.dropout = bool(getattr(job, "dropout", True))    # dropout masks kept for backward (the job's)
        # keys each query's attention operator covers: the whole s x s product (what the operator-level
        # searchers shard), narrowed only by a sliding window
        self.keys = model.attended_keys(self.S, causal=False)
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Operator] = []

    def tensor(self, name: str, shape, dtype: int | None = None, param: bool = False, tied_to: str | None = None) -> str:
        self.tensors[name] = Tensor(name, tuple(int(x) for x in shape), dtype or self.dt, param, tied_to)
        return name

    def param(self, name: str, shape) -> str:
        return self.tensor(name, shape, param=True)

    def op(self, name, kind, inputs, outputs, labels, **kw) -> None:
        self.ops.append(Operator(name=name, kind=kind, inputs=tuple(inputs), outputs=tuple(outputs),
                                 labels=tuple(tuple(x) for x in labels), **kw))

    # ---- pieces -------------------------------------------------------------------------------
    def embedding(self) -> str:
        m, B, S, H = self.m, self.B, self.S, self.m.hidden_size
        tokens = self.tensor("tokens", (B, S), INT_BYTES)
        wte = self.param("wte", (m.vocab_size, H))
        inputs, labels = [tokens, wte], ["bs", "vh"]
        if m.position_embedding == "learned":
            inputs.append(self.param("wpe", (S, H)))
            labels.append("sh")
        out = self.tensor("x_emb", (B, S, H))
        if not self.dropout:
            self.op("embed", "embedding", inputs, [out], labels + ["bsh"])
            return out
        mask = self.tensor("emb_mask", (B, S, H), MASK_BYTES)
        self.op("embed", "embedding", inputs, [out], labels + ["bsh", "bsh"], internals=(mask,), saves=(mask,))
        return out

    def norm(self, p: str, name: str, x: str, count: int) -> str:
        H = self.m.hidden_size
        ins, labs = [x, self.param(f"{p}{name}_w", (H,))], ["bsh", "h"]
        if self.m.norm == "layernorm":
            ins.append(self.param(f"{p}{name}_b", (H,)))
            labs.append("h")
        out = self.tensor(f"{p}{name}_out", (self.B, self.S, H))
        self.op(f"{p}{name}", "norm", ins, [out], labs + ["bsh"], no_cut=frozenset("h"), saves=(x,), count=count)
        return out

    def attention_block(self, p: str, x: str, count: int) -> str:
        m, B, S, H = self.m, self.B, self.S, self.m.hidden_size
        G, D = m.num_kv_heads, m.head_dim
        R = m.num_attention_heads // G
        n1 = self.norm(p, "ln1", x, count)
        ins = [n1, self.param(f"{p}wq", (H, G, R, D)), self.param(f"{p}wkv", (H, G, 2, D))]
        labs = ["bsh", "hgrd", "hgkd"]
        if m.use_bias:
            ins += [self.param(f"{p}bq", (G, R, D)), self.param(f"{p}bkv", (G, 2, D))]
            labs += ["grd", "gkd"]
        q = self.tensor(f"{p}q", (B, S, G, R, D))
        kv = self.tensor(f"{p}kv", (B, S, G, 2, D))
        self.op(f"{p}qkv", "matmul", ins, [q, kv], labs + ["bsgrd", "bsgkd"],
                flops=2.0 * B * S * H * (m.q_size + m.k_size + m.v_size), epilogue_passes=1.0 if m.use_bias else 0.0,
                no_cut=frozenset("rdk"), saves=(n1,), count=count)
        ctx = self.tensor(f"{p}ctx", (B, S, G, R, D))
        if self.attention == "math":
            # softmax output, dropout mask and dropout output: 2 + 1 + 2 bytes per score at 16 bits (the softmax
            # output alone without dropout)
            kept = self.tensor(f"{p}scores", (B, G, R, S, S), max(1, round(2.5 * self.dt)) if self.dropout else self.dt)
            labels, passes = "bgrst", 2.0
        else:
            # flash attention keeps only the fp32 log-sum-exp per query and head (Dao et al. 2022)
            kept = self.tensor(f"{p}lse", (B, G, R, S), FP32)
            labels, passes = "bgrs", 0.0
        # a fused (flash) kernel keeps its output for the backward pass too (Dao et al. 2022, algorithm 2)
        self.op(f"{p}attn", "attention", [q, kv], [ctx], ["bsgrd", "btgkd", "bsgrd", labels],
                internals=(kept,), flops=2.0 * B * S * self.keys * (m.q_size + m.attention_out_size), epilogue_passes=passes,
                no_cut=frozenset("rdkt"), saves=(q, kv, kept), count=count,
                kept_outputs=(ctx,) if self.attention == "flash" else ())
        o = self.tensor(f"{p}attn_out", (B, S, H))
        self.op(f"{p}proj", "matmul", [ctx, self.param(f"{p}wo", (G, R, D, H))], [o], ["bsgrd", "grdh", "bsh"],
                flops=2.0 * B * S * m.attention_out_size * H, no_cut=frozenset("rd"), saves=(ctx,), count=count)
        return self.residual(p, "res1", o, x, count)

    def residual(self, p: str, name: str, y: str, x: str, count: int) -> str:
        H = self.m.hidden_size
        ins, labs = [y, x], ["bsh", "bsh"]
        if self.m.use_bias:
            ins.append(self.param(f"{p}{name}_bias", (H,)))
            labs.append("h")
        out = self.tensor(f"{p}{name}_out", (self.B, self.S, H))
        if not self.dropout:
            self.op(f"{p}{name}", "elementwise", ins, [out], labs + ["bsh"], count=count)
            return out
        mask = self.tensor(f"{p}{name}_mask", (self.B, self.S, H), MASK_BYTES)
        self.op(f"{p}{name}", "elementwise", ins, [out], labs + ["bsh", "bsh"], internals=(mask,), saves=(mask,), count=count)
        return out

    def mlp(self, p: str, x: str, count: int) -> str:
        m, B, S, H, F = self.m, self.B, self.S, self.m.hidden_size, self.m.ffn_hidden_size
        gated = m.ffn_activation == "swiglu"
        w1 = self.param(f"{p}w1", (H, 2, F) if gated else (H, F))
        ins, labs = [x, w1], ["bsh", "huf" if gated else "hf"]
        if m.use_bias:
            ins.append(self.param(f"{p}b1", (2, F) if gated else (F,)))
            labs.append("uf" if gated else "f")
        act = self.tensor(f"{p}act", (B, S, F))
        pre = self.tensor(f"{p}fc1_out", (B, S, 2, F) if gated else (B, S, F))
        self.op(f"{p}fc1", "matmul", ins, [act], labs + ["bsf", "bsuf" if gated else "bsf"], internals=(pre,),
                flops=2.0 * B * S * H * F * (m.ffn_matrices - 1), epilogue_passes=2.0, no_cut=frozenset("u"),
                saves=(x, pre), count=count)
        y = self.tensor(f"{p}mlp_out", (B, S, H))
        self.op(f"{p}fc2", "matmul", [act, self.param(f"{p}w2", (F, H))], [y], ["bsf", "fh", "bsh"],
                flops=2.0 * B * S * F * H, saves=(act,), count=count)
        return y

    def moe(self, p: str, x: str, count: int) -> str:
        m, B, S, H = self.m, self.B, self.S, self.m.hidden_size
        moe = m.moe
        E, Fe, k = moe.num_experts, moe.expert_ffn_hidden_size, moe.top_k
        C = math.ceil(S * k / E)            # capacity factor 1 (Lepikhin et al., GShard)
        gated = m.ffn_activation == "swiglu"
        gates = self.tensor(f"{p}gates", (B, S, E), FP32)
        self.op(f"{p}router", "matmul", [x, self.param(f"{p}wr", (H, E))], [gates], ["bsh", "he", "bse"],
                flops=2.0 * B * S * H * E, epilogue_passes=2.0, saves=(x,), count=count)
        xe = self.tensor(f"{p}dispatched", (E, B, C, H))
        self.op(f"{p}dispatch", "dispatch", [x, gates], [xe], ["bsh", "bse", "ebch"], label_map=(("e", "b"),),
                no_cut=frozenset("sc"), count=count)
        w1 = self.param(f"{p}we1", (E, H, 2, Fe) if gated else (E, H, Fe))
        he = self.tensor(f"{p}expert_act", (E, B, C, Fe))
        pre = self.tensor(f"{p}expert_fc1_out", (E, B, C, 2, Fe) if gated else (E, B, C, Fe))
        self.op(f"{p}expert_fc1", "matmul", [xe, w1], [he], ["ebch", "ehuf" if gated else "ehf", "ebcf",
                                                             "ebcuf" if gated else "ebcf"],
                internals=(pre,), flops=2.0 * E * B * C * H * Fe * (m.ffn_matrices - 1), epilogue_passes=2.0,
                no_cut=frozenset("cu"), saves=(xe, pre), count=count)
        ye = self.tensor(f"{p}expert_out", (E, B, C, H))
        self.op(f"{p}expert_fc2", "matmul", [he, self.param(f"{p}we2", (E, Fe, H))], [ye], ["ebcf", "efh", "ebch"],
                flops=2.0 * E * B * C * Fe * H, no_cut=frozenset("c"), saves=(he,), count=count)
        y = self.tensor(f"{p}moe_out", (B, S, H))
        self.op(f"{p}combine", "combine", [ye, gates], [y], ["ebch", "bse", "bsh"], label_map=(("b", "e"),),
                no_cut=frozenset("c"), count=count)
        return y

    def layer(self, p: str, moe: bool, count: int) -> None:
        x = self.tensor(f"{p}x_in", (self.B, self.S, self.m.hidden_size))
        x1 = self.attention_block(p, x, count)
        n2 = self.norm(p, "ln2", x1, count)
        y = self.moe(p, n2, count) if moe else self.mlp(p, n2, count)
        self.residual(p, "res2", y, x1, count)

    def head(self, x: str, tied: bool) -> None:
        m, B, S, H = self.m, self.B, self.S, self.m.hidden_size
        xf = self.norm("", "lnf", x, 1)
        w = self.tensor("w_head", (H, m.vocab_size), param=True, tied_to="wte" if tied else None)
        logits = self.tensor("logits", (B, S, m.vocab_size), FP32)
        self.op("head", "matmul", [xf, w], [logits], ["bsh", "hv", "bsv"],
                flops=2.0 * B * S * H * m.vocab_size, saves=(xf,))
        targets = self.tensor("targets", (B, S), INT_BYTES)
        loss = self.tensor("loss", (B, S), FP32)
        self.op("loss", "loss", [logits, targets], [loss], ["bsv", "bs", "bs"],
                stat_labels=frozenset("v"), stat_bytes=3.0 * FP32, saves=(logits,))


def transformer_graph(model: ModelSpec, job: TrainingJob, batch: int = 1, layers: tuple[int, int] | None = None,
                      first_stage: bool = True, last_stage: bool = True) -> OperatorGraph:
    """The graph of ``batch`` sequences of ``job.seq_length`` tokens through layers [start, stop)
    (default all), with the embedding when ``first_stage`` and the final norm, LM head and loss when
    ``last_stage`` (a pipeline stage's graph)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise AdvisorError(f"graph batch must be a positive number of sequences, got {batch!r}")
    if model.mla is not None or (model.moe is not None and model.moe.shared_ffn):
        raise AdvisorError(f"model {model.name}: the operator-level searchers (drec, ilp) have no operators for "
                           "multi-head latent attention or shared experts yet; use --searcher enumerate")
    start, stop = layers if layers is not None else (0, model.num_layers)
    if not 0 <= start < stop <= model.num_layers:
        raise AdvisorError(f"layer range [{start}, {stop}) is not inside the model's {model.num_layers} layers")
    b = _Builder(model, job, batch)
    kinds = ["moe" if model.is_moe_layer(i) else "dense" for i in range(start, stop)]
    prefix = {"dense": "layer.", "moe": "moe_layer."}
    x = b.embedding() if first_stage else None
    for kind in ("dense", "moe"):
        n = kinds.count(kind)
        if n:
            b.layer(prefix[kind], kind == "moe", n)
    links = []
    first, last = prefix[kinds[0]], prefix[kinds[-1]]
    if x is not None:
        links.append(Link(x, f"{first}x_in", 1))
    transitions: dict[tuple[str, str], int] = {}
    for a, c in zip(kinds, kinds[1:]):
        transitions[(a, c)] = transitions.get((a, c), 0) + 1
    for (a, c), n in transitions.items():
        links.append(Link(f"{prefix[a]}res2_out", f"{prefix[c]}x_in", n))
    if last_stage:
        xin = b.tensor("x_final", (batch, job.seq_length, model.hidden_size))
        links.append(Link(f"{last}res2_out", xin, 1))
        b.head(xin, tied=model.tie_embeddings and first_stage)
    stage = "" if (first_stage and last_stage and (start, stop) == (0, model.num_layers)) else f" layers {start}-{stop - 1}"
    return OperatorGraph(
        name=f"{model.name}{stage} (batch {batch} x {job.seq_length})",
        source=f"built from the model description ({model.source})".replace("\n", " "),
        tensors=b.tensors, operators=tuple(b.ops), links=tuple(links),
    )
