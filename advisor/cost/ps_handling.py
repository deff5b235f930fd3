"""Per-tensor handling in a parameter-server step: the host operations a worker and a server spend
on each tensor piece they exchange, besides the bytes (advisor.cost.parameter_server prices those).

A PS runtime handles the tensors it serves one by one: ps-lite keys (Li et al. 2014, section 3:
key-value pairs, each server a key range), MindSpore's per-parameter Push and Pull kernels, and the
executor's server and worker (advisor/executor/ps), whose operations per piece and step are counted
here from its code:

* a worker, for a table piece: selects the piece's rows of its batch for the pull request (two
  comparisons, their conjunction, the selection and the offset: 5), places the answer in the pulled
  table (its buffer, the same mask again, the reshape and the copy: 6), selects the piece's
  gradient rows for the push (4), packs it (1): 16; for a dense piece (a Linear's weight or bias): places the answer (3: buffer,
  reshape, copy), slices and packs its gradient (2): 5;
* a server, per piece: for each worker, gathers the requested rows (a table) or the whole tensor and
  packs the answer (2), unpacks the push (1); then concatenates the workers' gradient rows and
  values, averages and wraps them as a sparse gradient (a table: 4), or stacks, sums and averages the
  dense gradients (3); then its optimizer steps the piece (the profile's per-tensor optimizer time).

Priced, as the messages are (advisor.cost.parameter_server.message_times), where the profile was
measured for this kind of runtime: a profile from `advisor calibrate` (inter_node.message_overhead_us
set), whose per-operator host time (launch_overhead_us) and per-tensor optimizer time apply to the
executor's operators. A bundled accelerator profile's launch time is a Python-dispatched kernel's,
not a PS runtime's per-key work (ps-lite and MindSpore's servers handle keys in C++), so there the
handling is not priced. On the critical path of a synchronous step the worker's handling comes
before and after its compute, and the fullest server's after the last push.
"""

from __future__ import annotations

from advisor.specs.hardware import HardwareProfile
from advisor.specs.recommendation import RecModelSpec

WORKER_OPS_SPARSE = 16
WORKER_OPS_DENSE = 5
SERVER_OPS_PER_WORKER = 3
SERVER_OPS_SPARSE = 4
SERVER_OPS_DENSE = 3
TENSORS_PER_LINEAR = 2          # a Linear is served as its weight and its bias


def _pieces(model: RecModelSpec, name: str) -> tuple[bool, int]:
    """(whether the tensor is a table, how many tensors it is served as)."""
    if any(t.name == name for t in model.tables):
        return True, 1
    return False, TENSORS_PER_LINEAR


def handling_s(model: RecModelSpec, hw: HardwareProfile, shards: dict[str, list[tuple[int, float]]], servers: int,
               workers: int) -> tuple[float, float]:
    """(a worker's, the busiest server's) seconds of per-piece handling per step (0, 0 without a
    measured per-message time)."""
    if hw.inter.message_overhead_us is None:
        return 0.0, 0.0
    op_s = hw.device.launch_overhead_us * 1e-6
    opt_s = hw.device.optimizer_overhead_us_per_tensor * 1e-6
    worker_ops = 0.0
    server_s = [0.0] * servers
    for name, placed in shards.items():
        table, tensors = _pieces(model, name)
        worker_ops += tensors * len(placed) * (WORKER_OPS_SPARSE if table else WORKER_OPS_DENSE)
        own = SERVER_OPS_PER_WORKER * workers + (SERVER_OPS_SPARSE if table else SERVER_OPS_DENSE)
        for s, _ in placed:
            server_s[s] += tensors * (own * op_s + opt_s)
    return worker_ops * op_s, max(server_s, default=0.0)
