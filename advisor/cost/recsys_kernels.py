"""Device work of one recommendation-model worker per step: the memory traffic of the embedding
lookups and their sparse backward, of the feature interaction and of the towers' element-wise
kernels, and the placement of tables on devices for the sharded (all-to-all) mode.

Embeddings (per table or shard on one device; L lookups, U distinct rows, O pooled values written,
d columns, fp32 rows, activations of `act` bytes):

* forward: read L rows (d x 4 bytes) and their 8-byte ids, write O pooled values (act each)
  (facebookresearch/dlrm dlrm_s_pytorch.py apply_emb: EmbeddingBag per table; NVIDIA
  DeepLearningExamples PyTorch/Recommendation/DLRM dlrm/cuda_src/gather_gpu_fused.cu lookupEmbeddings);
* backward with a sparse gradient, as PyTorch trains DLRM (nn.EmbeddingBag(sparse=True) in the
  reference, gather_gpu_fused_bwd in NVIDIA's: it reads the pooled gradient and writes one fp32
  gradient row and one id per lookup, a COO tensor), then the optimizer's dense += sparse coalesces
  it: a radix sort of the L (id, position) pairs (CUB DeviceRadixSort over the whole 64-bit key,
  8 bits a pass: 8 passes reading and writing 16 bytes a pair), a gather of the L gradient rows in
  sorted order and a write of the U summed rows (ATen's sparse coalesce); the update of the U rows
  is the optimizer's traffic (advisor.cost.recsys.OPTIMIZER_BYTES). A fused backward-optimizer
  kernel (FBGEMM's TBE, as TorchRec runs it) skips the COO rows; pricing the unfused path keeps the
  estimate on the side of the published PyTorch measurements (advisor/validation/recsys_runs.yaml).
* fp16 mixed precision: torch.cuda.amp.GradScaler unscales and checks every gradient in place
  (_amp_foreach_non_finite_check_and_unscale_: read and write), the L COO rows included; bf16 and
  fp32 need no loss scaling (PyTorch AMP documentation, "Gradient Scaling").

Interaction `dot` (dlrm_s_pytorch.py interact_features; DeepLearningExamples dlrm/nn/interactions.py):
torch.cat of the F vectors (read and write F x d), the batched F x F product (its FLOPs priced as
GEMM work by the caller), the lower triangle gathered and concatenated with the dense vector (write
the output); backward reads the output gradient and the F x d input and writes the F x d input
gradient. `cat`: the concatenation forward (read and write the width), a slice backward (no copy).
Towers: bias and ReLU read and write each Linear's output forward; backward the ReLU gradient reads
the gradient and the saved output and writes the gradient, and the bias gradient reads it again.

Sharded placement: column-wise, table-wise, then row-wise (TorchRec's sharding types,
torchrec/distributed/types.py ShardingType; DeepLearningExamples DLRM README "Hybrid-parallel
multi-GPU with all-2-all communication": whole tables per GPU, at most ceil(tables / GPUs) each).
A table whose pooled width exceeds an even share of all tables' width is cut column-wise (each piece
d/k columns of every row, sends d/k values per sample; k divides d and keeps at least MIN_COLUMNS
columns, FBGEMM's TBE needs d a multiple of 4); a piece that does not fit a device's memory budget is
split row-wise (each shard sends partial sums for every sample). Pieces go, largest output first,
to the device with room that sends the least so far (then holds the least).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.specs.recommendation import INDEX_BYTES, PARAM_BYTES, EmbeddingTable, RecModelSpec

SORT_PASSES = 8                                   # 64-bit keys, 8-bit radix digits (module docstring)
SORT_BYTES_PER_PASS = 2 * (INDEX_BYTES + INDEX_BYTES)   # read and write each (id, position) pair
MIN_COLUMNS = 4                                   # FBGEMM TBE: embedding dims in multiples of 4


@dataclass(frozen=True)
class TableWork:
    """One table or shard on one device for one step."""

    dim: int                 # columns this device holds
    lookups: float           # ids looked up
    unique_rows: float       # distinct rows touched (what the optimizer updates)
    outputs: float           # pooled values written (one per sample and column, or per lookup with concat)


def local_work(model: RecModelSpec, samples: float, unique_rows) -> list[TableWork]:
    """Every table looked up for `samples` samples on this device (replicated tables, PS workers)."""
    return [TableWork(t.dim, t.lookups_per_sample * samples, unique_rows(t, samples), t.output_width * samples)
            for t in model.tables]


def embedding_bytes(work: list[TableWork], act: int, fp16_scaling: bool) -> tuple[float, float]:
    """(forward, backward) bytes of the lookups and the sparse backward up to the optimizer."""
    fwd = bwd = 0.0
    for w in work:
        row = w.dim * PARAM_BYTES
        fwd += w.lookups * (row + INDEX_BYTES) + w.outputs * act
        coo = w.lookups * (row + INDEX_BYTES)                     # gradient rows and ids written
        sort = w.lookups * SORT_PASSES * SORT_BYTES_PER_PASS
        coalesce = w.lookups * row + w.unique_rows * row           # gathered in order, summed rows written
        scale = 2.0 * w.lookups * row if fp16_scaling else 0.0     # GradScaler over the COO rows
        bwd += w.outputs * act + coo + sort + coalesce + scale
    return fwd, bwd


def interaction_bytes(model: RecModelSpec, samples: float, act: int) -> tuple[float, float]:
    """(forward, backward) bytes of the interaction's memory-bound kernels."""
    if model.interaction == "dot":
        inputs = model.interaction_vectors * model.tables[0].dim
        out = model.interaction_width
        return samples * act * (2 * inputs + inputs + out), samples * act * (out + 2 * inputs)
    width = model.interaction_width
    return samples * act * 2 * width, 0.0


def tower_elementwise_bytes(model: RecModelSpec, samples: float, act: int) -> tuple[float, float]:
    outputs = sum(b for _, _, b in model.mlp_layers()) * samples * act
    return 2.0 * outputs, 4.0 * outputs


def dense_gradient_scaling_bytes(model: RecModelSpec, fp16_scaling: bool) -> float:
    """GradScaler's in-place unscale of the towers' fp32 gradients (fp16 only)."""
    return 2.0 * model.dense_params * PARAM_BYTES if fp16_scaling else 0.0


# ---- sharded placement -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    table: EmbeddingTable
    columns: int             # columns of the table in this piece (all of them unless column-wise)
    row_share: float         # share of the rows (1 unless row-wise)

    @property
    def params(self) -> float:
        return self.table.rows * self.row_share * self.columns

    @property
    def output(self) -> float:
        """Values per sample it sends: concat tables only the lookups in its rows, sum-pooled a
        (partial) sum for every sample."""
        share = self.row_share if self.table.pooling == "concat" else 1.0
        return self.table.output_width * self.columns / self.table.dim * share


def _column_pieces(table: EmbeddingTable, target_width: float) -> int:
    """Column-wise pieces of a table: the fewest k dividing dim with output_width / k <= target."""
    if table.output_width <= target_width:
        return 1
    for k in range(2, table.dim // MIN_COLUMNS + 1):
        if table.dim % k == 0 and table.output_width / k <= target_width:
            return k
    return max(1, table.dim // MIN_COLUMNS) if table.dim % MIN_COLUMNS == 0 else 1


def place_tables(model: RecModelSpec, devices: int, budget_params: float) -> list[list[Piece]]:
    """Pieces per device (module docstring). budget_params: table parameters (with their optimizer
    state folded in by the caller) one device can hold."""
    target = model.pooled_width() / devices
    pieces: list[Piece] = []
    for t in model.tables:
        k = _column_pieces(t, target)
        for _ in range(k):
            p = Piece(t, t.dim // k, 1.0)
            r = max(1, math.ceil(p.params / budget_params - 1e-9)) if budget_params > 0 else 1
            r = min(r, devices)
            pieces += [Piece(t, p.columns, 1.0 / r)] * r
    held = [0.0] * devices
    sends = [0.0] * devices
    out: list[list[Piece]] = [[] for _ in range(devices)]
    for p in sorted(pieces, key=lambda p: (-p.output, -p.params, p.table.name)):
        order = sorted(range(devices), key=lambda i: (sends[i], held[i], i))
        room = [i for i in order if held[i] + p.params <= budget_params and p not in out[i]]
        free = [i for i in order if p not in out[i]] or order
        d = (room or free)[0]
        out[d].append(p)
        held[d] += p.params
        sends[d] += p.output
    return out


def shard_work(pieces: list[Piece], batch: float, unique_rows) -> list[TableWork]:
    """The lookups a device does for the whole global batch over the pieces it holds."""
    work = []
    for p in pieces:
        t = p.table
        lookups = batch * t.lookups_per_sample * p.row_share
        work.append(TableWork(p.columns, lookups, unique_rows(t, batch, p.row_share), batch * p.output))
    return work
