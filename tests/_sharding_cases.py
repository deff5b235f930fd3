"""Small operator-sharding problems for the searcher-vs-oracle tests (not collected by pytest)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from advisor.cost.memory import ALLOCATOR_OVERHEAD, GIB
from advisor.graph.loader import graph_from_dict
from advisor.graph.transformer import transformer_graph
from advisor.search.sharding import DeviceMesh, ShardingOptions, ShardingProblem
from advisor.specs.hardware import load_hardware
from advisor.specs.job import TrainingJob
from advisor.specs.model import model_from_dict

JOB = TrainingJob(global_batch_size=8, seq_length=128, dtype="fp16")     # the Ascend 910 has no bf16
A100 = load_hardware("dgx-a100-80g")
ASCEND = load_hardware("ascend-910")
# two devices per node, so that eight devices span four nodes and every link tier is used
SMALL_NODES = replace(A100, name="two-per-node", node=replace(A100.node, devices_per_node=2, group_size=2))
HARDWARE = {"a100": A100, "ascend": ASCEND, "two-per-node": SMALL_NODES}
MESHES = [(4,), (2, 2), (8,), (2, 4), (4, 2), (2, 3), (3, 2)]


@st.composite
def small_graphs(draw) -> dict:
    """A chain of 2-6 operators (matmul, element-wise, norm; a residual add; a loss) as graph JSON."""
    batch = draw(st.sampled_from([2, 4, 6, 8, 16]))
    width = draw(st.sampled_from([4, 8, 16, 64]))
    tensors = {"x0": {"shape": [batch, width]}}
    ops = []
    current, dim, skip = "x0", width, None
    n_ops = draw(st.integers(2, 5))
    for i in range(n_ops):
        kind = draw(st.sampled_from(["matmul", "matmul", "elementwise", "norm", "add"]))
        out = f"x{i + 1}"
        if kind == "matmul":
            new = draw(st.sampled_from([4, 8, 16, 64, 256]))
            tensors[f"w{i}"] = {"shape": [dim, new], "param": True}
            tensors[out] = {"shape": [batch, new]}
            ops.append({"name": f"op{i}", "kind": "matmul", "inputs": [current, f"w{i}"], "outputs": [out]})
            skip, dim = current if dim == new else skip, new
        elif kind == "add" and skip is not None and tensors[skip]["shape"] == [batch, dim]:
            tensors[out] = {"shape": [batch, dim]}
            ops.append({"name": f"op{i}", "kind": "elementwise", "inputs": [current, skip], "outputs": [out]})
        elif kind == "norm":
            tensors[f"g{i}"] = {"shape": [dim], "param": True}
            tensors[out] = {"shape": [batch, dim]}
            ops.append({"name": f"op{i}", "kind": "norm", "inputs": [current, f"g{i}"], "outputs": [out]})
        else:
            tensors[out] = {"shape": [batch, dim]}
            ops.append({"name": f"op{i}", "kind": "elementwise", "inputs": [current], "outputs": [out]})
        current = out
    if draw(st.booleans()):
        tensors["targets"] = {"shape": [batch], "dtype_bytes": 4}
        tensors["loss"] = {"shape": [batch], "dtype_bytes": 4}
        ops.append({"name": "loss", "kind": "loss", "inputs": [current, "targets"], "outputs": ["loss"]})
    return {"name": "random-chain", "tensors": tensors, "operators": ops}


def problem(graph_json: dict, hw_name: str, mesh_shape: tuple[int, ...], memory_factor: float | None = None,
            micro_batches: int = 1, zero: int = 1) -> ShardingProblem:
    """The problem; with memory_factor, the limit is that multiple of the leanest sharding's memory."""
    graph = graph_from_dict(graph_json, "random.json")
    hw = HARDWARE[hw_name]
    mesh = DeviceMesh.for_devices(hw, mesh_shape_devices(mesh_shape), shape=mesh_shape)
    options = ShardingOptions(num_micro_batches=micro_batches, zero_stage=zero)
    p = ShardingProblem(graph, mesh, hw, JOB, options)
    if memory_factor is None:
        return p
    need = p.min_memory_bytes() * memory_factor * (1.0 + ALLOCATOR_OVERHEAD)
    return ShardingProblem(graph, mesh, hw, JOB, replace(options, memory_limit_gib=need / GIB))


def mesh_shape_devices(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def tiny_transformer():
    """GPT-style model small enough for tests; vocabulary and heads divisible by 8."""
    return model_from_dict({
        "name": "tiny-gpt", "source": "test", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
        "vocab_size": 4096, "seq_length": 128, "use_bias": True, "tie_embeddings": True,
        "position_embedding": "learned"}, "tiny")


def megatron_layer_problem(hw_name: str = "a100", mesh_shape=(8,)) -> ShardingProblem:
    """One layer of a 7B-class transformer (no embedding or head) on 8 devices, tensor-parallel-style
    cuts only (batch and sequence may not be cut)."""
    model = model_from_dict({
        "name": "layer-7b", "source": "test", "num_layers": 1, "hidden_size": 4096, "num_attention_heads": 32,
        "vocab_size": 32000, "seq_length": 2048}, "layer-7b")
    job = TrainingJob(global_batch_size=8, seq_length=2048, dtype="fp16")
    graph = transformer_graph(model, job, batch=4, first_stage=False, last_stage=False)
    hw = HARDWARE[hw_name]
    mesh = DeviceMesh.for_devices(hw, mesh_shape_devices(mesh_shape), shape=mesh_shape)
    return ShardingProblem(graph, mesh, hw, job, ShardingOptions(forbid_cut=frozenset("bs")))
