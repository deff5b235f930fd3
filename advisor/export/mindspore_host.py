"""MindSpore export of a transformer plan with its word embedding on the host (parallel.host_embedding).

MindSpore's Host&Device heterogeneous training (tutorials/source_en/parallel/host_device_training.md)
places an operator on the host with ``Primitive.set_device("CPU")`` and updates parameters there with
an optimizer whose ``target`` is "CPU". MindFormers' legacy Llama keeps its input embedding in the
``tok_embeddings`` cell (``LlamaEmbedding``: a ``Gather`` primitive over ``embedding_weight``;
mindformers/models/llama/llama_layer.py), which the helper below finds by name. MindFormers' YAML has
no switch for it, so the helper is for the user's training script; the export says so.
"""

from __future__ import annotations

from advisor.export._common import comment_block, header_lines
from advisor.plan import Plan

# the input-embedding cell of MindFormers' legacy Llama (LlamaModel.tok_embeddings)
EMBEDDING_CELL = "tok_embeddings"

_HELPER = '''import mindspore as ms

EMBEDDING_CELL = {cell!r}


def _in_cell(name, cell_name):
    return cell_name in name.replace("/", ".").split(".")


def place_embedding_on_host(network, cell_name=EMBEDDING_CELL):
    """Run the word-embedding lookup on the host CPU; returns (host parameters, device parameters)
    for two optimizers, the first with optimizer.target = "CPU". Fails when no cell has that name."""
    cells = [cell for name, cell in network.cells_and_names() if name.split(".")[-1] == cell_name]
    if not cells:
        raise RuntimeError(f"the network has no cell named {{cell_name!r}}; pass the embedding cell's name")
    for cell in cells:
        for attr in vars(cell).values():
            if isinstance(attr, ms.ops.Primitive):
                attr.set_device("CPU")
    host, device = [], []
    for param in network.trainable_params():
        (host if _in_cell(param.name, cell_name) else device).append(param)
    return host, device


# In your training script, after building the network:
#   host_params, device_params = place_embedding_on_host(network)
#   host_optimizer = ms.nn.AdamWeightDecay(host_params, learning_rate=lr)
#   host_optimizer.target = "CPU"          # the table's Adam runs on the host
#   device_optimizer = ms.nn.AdamWeightDecay(device_params, learning_rate=lr)
'''


def host_embedding_files(plan: Plan, notes: list[str]) -> dict[str, str]:
    """``host_embedding.py`` for plans priced with the word embedding on the host (else nothing)."""
    if not plan.strategy.host_embedding:
        return {}
    notes.append("parallel.host_embedding: host_embedding.py puts the word-embedding lookup "
                 f"({EMBEDDING_CELL}) on the host CPU with Primitive.set_device('CPU') and splits its table off for "
                 "an optimizer with target 'CPU' (MindSpore Host&Device training); MindFormers' YAML has no such "
                 "switch, so call it from your training script")
    head = comment_block(header_lines(plan, "MindSpore Host&Device: the word embedding on the host"))
    return {"host_embedding.py": head + _HELPER.format(cell=EMBEDDING_CELL)}
