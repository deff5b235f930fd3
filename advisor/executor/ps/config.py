"""A parameter-server plan read into what the processes run (PsConfig), with ``--tiny``.

Read from the plan JSON only (advisor.executor's rule):

* ``model``: ``family: recommendation`` with ``embedding_tables`` (name, rows, dim,
  lookups_per_sample, sparse, optional pooling sum | concat) and ``dense`` (bottom_mlp, top_mlp,
  interaction dot | cat). The bottom MLP's input width is ``dense_features`` (advisor's model
  files), else ``num_dense_features``, else 13 (Criteo's 13 integer features, Naumov et al. 2019,
  arXiv 1906.00091, section 5) when there is a bottom MLP, else 0. ``lookups_per_sample`` is
  rounded to a whole number of ids per sample (at least 1).
* ``parallel.parameter_server``: mode ps | hybrid, synchronous, servers, server_placement, tensors,
  sharding {tensor: [server ids]}. Tensor names are the table names and one name per Linear layer,
  ``bottom_mlp_<i>`` / ``top_mlp_<i>`` (weight and bias together), as advisor's model spec names
  them. A tensor on k servers is split by rows (tables) or output rows (layers) into k contiguous,
  near-equal ranges (Li et al. 2014 section 4.2: keys partitioned into ranges). A server tensor
  the sharding does not name goes whole to the server holding the fewest bytes so far.
* workers: ``parallel.dp`` (else ``cluster.devices``); ``training``: global_batch_size, optimizer,
  dtype, optional learning_rate.

``--tiny`` keeps the tables, their lookups, the towers' depth, the interaction, the optimizer and
every role and count (servers, workers, sharding lists) and shrinks rows to at most 64, dims to at
most 8, tower widths to at most 16 (the logit stays 1), and the batch to 8 samples per worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError

MODES = ("ps", "hybrid")
OPTIMIZERS = ("sgd", "adagrad", "adam", "adamw")
DEFAULT_DENSE_FEATURES = 13      # Criteo's integer features (module doc)
TINY_ROWS, TINY_DIM, TINY_WIDTH, TINY_BATCH_PER_WORKER = 64, 8, 16, 8


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    lookups: int
    sparse: bool
    pooling: str = "sum"

    @property
    def output_width(self) -> int:
        return self.dim if self.pooling == "sum" else self.lookups * self.dim


@dataclass(frozen=True)
class RecModel:
    tables: tuple[Table, ...]
    dense_features: int
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    interaction: str

    @property
    def bottom_width(self) -> int:
        return self.bottom_mlp[-1] if self.bottom_mlp else self.dense_features

    @property
    def interaction_width(self) -> int:
        if self.interaction == "dot":
            n = len(self.tables) + (1 if self.bottom_width else 0)
            return n * (n - 1) // 2 + self.bottom_width
        return self.bottom_width + sum(t.output_width for t in self.tables)

    def layers(self) -> list[tuple[str, int, int]]:
        """(name, fan_in, fan_out) of every Linear, bottom tower first."""
        out = []
        widths = (self.dense_features,) + self.bottom_mlp
        out += [(f"bottom_mlp_{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
        widths = (self.interaction_width,) + self.top_mlp
        out += [(f"top_mlp_{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
        return out

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.tables] + [name for name, _, _ in self.layers()]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter: a table (rows, dim), a layer's weight (fan_out, fan_in) and bias (fan_out,)."""
        shapes: dict[str, tuple[int, ...]] = {t.name: (t.rows, t.dim) for t in self.tables}
        for name, a, b in self.layers():
            shapes[f"{name}.weight"] = (b, a)
            shapes[f"{name}.bias"] = (b,)
        return shapes

    def params_of(self, tensor: str) -> list[str]:
        return [tensor] if any(t.name == tensor for t in self.tables) else [f"{tensor}.weight", f"{tensor}.bias"]

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)


@dataclass(frozen=True)
class Piece:
    """Rows [start, end) of one parameter, held by one server."""

    param: str
    server: int
    start: int
    end: int
    sparse: bool          # a sparse table's rows: pulled and pushed as touched rows only


@dataclass(frozen=True)
class PsConfig:
    name: str
    model: RecModel
    mode: str
    synchronous: bool
    servers: int
    workers: int
    server_placement: str
    server_tensors: tuple[str, ...]
    pieces: tuple[Piece, ...]
    optimizer: str
    learning_rate: float
    global_batch_size: int
    steps: int
    seed: int
    tiny: bool
    notes: tuple[str, ...] = ()
    replicas: int = 0           # 1: each server's shard copied on the next server, taken over if it fails

    @property
    def local_batch_size(self) -> int:
        return self.global_batch_size // self.workers

    def server_pieces(self, server: int) -> list[Piece]:
        return [p for p in self.pieces if p.server == server]

    def replicated_params(self) -> list[str]:
        """Parameters the workers hold and all-reduce (hybrid)."""
        held = {p.param for p in self.pieces}
        return [name for name in self.model.param_shapes() if name not in held]


def _err(where: str, what: str, value: Any) -> AdvisorError:
    return AdvisorError(f"{where}: {what}, got {str(value)[:60]!r}")


def _pos_int(d: dict, key: str, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise _err(f"{where}.{key}", "must be a positive integer", v)
    return v


def _widths(d: dict, key: str, where: str) -> tuple[int, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        raise _err(f"{where}.{key}", "must be a list of positive integers", v)
    return tuple(v)


def read_model(m: Any, where: str = "model") -> RecModel:
    if not isinstance(m, dict) or m.get("family") != "recommendation":
        raise AdvisorError(f"{where}: a parameter-server plan needs a model with family: recommendation")
    raw = m.get("embedding_tables")
    if not isinstance(raw, list) or not raw:
        raise _err(f"{where}.embedding_tables", "must be a non-empty list", raw)
    tables = []
    for i, t in enumerate(raw):
        w = f"{where}.embedding_tables[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _err(w, "must be a mapping with a name", t)
        lookups = t.get("lookups_per_sample", 1)
        if not isinstance(lookups, (int, float)) or isinstance(lookups, bool) or lookups <= 0:
            raise _err(f"{w}.lookups_per_sample", "must be a positive number", lookups)
        pooling = t.get("pooling", "sum")
        if pooling not in ("sum", "concat"):
            raise _err(f"{w}.pooling", "must be sum or concat", pooling)
        tables.append(Table(t["name"], _pos_int(t, "rows", w), _pos_int(t, "dim", w), max(1, round(lookups)),
                            bool(t.get("sparse", True)), pooling))
    dense = m.get("dense")
    if not isinstance(dense, dict):
        raise _err(f"{where}.dense", "must be a mapping with bottom_mlp, top_mlp, interaction", dense)
    bottom, top = _widths(dense, "bottom_mlp", f"{where}.dense"), _widths(dense, "top_mlp", f"{where}.dense")
    if not top or top[-1] != 1:
        raise _err(f"{where}.dense.top_mlp", "must end with the one-wide logit layer", list(top))
    interaction = dense.get("interaction", "dot")
    if interaction not in ("dot", "cat"):
        raise _err(f"{where}.dense.interaction", "must be dot or cat", interaction)
    features = m.get("dense_features", m.get("num_dense_features", DEFAULT_DENSE_FEATURES if bottom else 0))
    if not isinstance(features, int) or isinstance(features, bool) or features < 0 or (bottom and features == 0):
        raise _err(f"{where}.dense_features", "must be a positive integer (the bottom MLP's input width)", features)
    model = RecModel(tuple(tables), features, bottom, top, interaction)
    if interaction == "dot":
        dims = {t.dim for t in tables}
        if len(dims) != 1 or any(t.pooling != "sum" for t in tables) or (model.bottom_width and model.bottom_width not in dims):
            raise AdvisorError(f"{where}.dense.interaction: dot needs every table pooled by sum to one dim and the "
                               f"bottom output at that dim (dims {sorted(dims)}, bottom output {model.bottom_width})")
    return model


def shrink(model: RecModel) -> RecModel:
    """--tiny (module doc): same structure, small sizes; dot keeps its one common dim."""
    dim = min(TINY_DIM, min(t.dim for t in model.tables))
    tables = tuple(Table(t.name, min(t.rows, TINY_ROWS), dim if model.interaction == "dot" else min(t.dim, TINY_DIM),
                         t.lookups, t.sparse, t.pooling) for t in model.tables)
    bottom = tuple(min(w, TINY_WIDTH) for w in model.bottom_mlp)
    features = min(model.dense_features, TINY_WIDTH)
    if model.interaction == "dot":
        if bottom:
            bottom = bottom[:-1] + (dim,)
        elif features:
            features = dim
    top = tuple(min(w, TINY_WIDTH) for w in model.top_mlp[:-1]) + (1,)
    return RecModel(tables, features, bottom, top, model.interaction)


def _split(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous ranges covering [0, n), sizes differing by at most one."""
    base, extra = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def place(model: RecModel, server_tensors: list[str], sharding: dict, servers: int, where: str) -> list[Piece]:
    shapes = model.param_shapes()
    nbytes = {t: sum(4 * _numel(shapes[p]) for p in model.params_of(t)) for t in server_tensors}
    load = [0] * servers
    assigned: dict[str, list[int]] = {}
    for t in server_tensors:
        if t in sharding:
            ids = sharding[t]
            if (not isinstance(ids, list) or not ids or len(set(ids)) != len(ids)
                    or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < servers for s in ids)):
                raise _err(f"{where}.sharding.{t}", f"must list distinct server ids in 0..{servers - 1}", ids)
            assigned[t] = ids
            for s in ids:
                load[s] += nbytes[t] / len(ids)
    for t in sorted((t for t in server_tensors if t not in assigned), key=lambda t: -nbytes[t]):
        s = min(range(servers), key=lambda i: (load[i], i))
        assigned[t], load[s] = [s], load[s] + nbytes[t]
    pieces = []
    for t in server_tensors:
        table = model.table(t)
        for param in model.params_of(t):
            for server, (a, b) in zip(assigned[t], _split(shapes[param][0], len(assigned[t]))):
                if b > a:
                    pieces.append(Piece(param, server, a, b, bool(table and table.sparse)))
    return pieces


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ps_config_from_plan(plan: dict[str, Any], *, steps: int = 5, tiny: bool = False, dtype: str | None = None,
                        seed: int = 1234) -> PsConfig:
    par = plan.get("parallel") or {}
    ps = par.get("parameter_server")
    where = "parallel.parameter_server"
    if not isinstance(ps, dict):
        raise _err(where, "must be a mapping", ps)
    mode = ps.get("mode")
    if mode not in MODES:
        raise _err(f"{where}.mode", "must be ps or hybrid", mode)
    synchronous = ps.get("synchronous", True)
    if not isinstance(synchronous, bool):
        raise _err(f"{where}.synchronous", "must be true or false", synchronous)
    servers = _pos_int(ps, "servers", where)
    replicas = ps.get("replicas", 0)
    if replicas not in (0, 1) or isinstance(replicas, bool):
        raise _err(f"{where}.replicas", "must be 0 or 1", replicas)
    if replicas and servers < 2:
        raise _err(f"{where}.replicas", "needs at least 2 servers (each server's backup is the next one)", replicas)
    if replicas and not synchronous:
        raise _err(f"{where}.replicas", "runs with synchronous servers only: the executor's takeover replays a "
                   "synchronous round to the backup, and an asynchronous server's copy would need the order of "
                   "every pull and push it served (plan synchronous servers, or replicas 0)", replicas)
    for key in ("tp", "pp", "cp", "ep"):
        if par.get(key, 1) != 1:
            raise _err(f"parallel.{key}", "must be 1 for a parameter-server run (workers are data parallel)", par[key])
    workers = par.get("dp") or (plan.get("cluster") or {}).get("devices")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0:
        raise _err("parallel.dp", "must be the number of workers", workers)
    model = read_model(plan.get("model"))
    names = model.tensor_names()
    tensors = ps.get("tensors", names if mode == "ps" else None)
    if not isinstance(tensors, list) or not tensors or not all(isinstance(t, str) for t in tensors):
        raise _err(f"{where}.tensors", "must list the tensors held by servers", tensors)
    unknown = [t for t in tensors if t not in names]
    if unknown:
        raise _err(f"{where}.tensors", f"names no tensor of the model (tables and {names[-1].rsplit('_', 1)[0]}_<i>)", unknown[0])
    server_tensors = names if mode == "ps" else [t for t in names if t in tensors]
    sharding = ps.get("sharding") or {}
    if not isinstance(sharding, dict):
        raise _err(f"{where}.sharding", "must map tensor names to server id lists", sharding)
    training = plan.get("training") or {}
    optimizer = training.get("optimizer", "sgd")
    if optimizer not in OPTIMIZERS:
        raise _err("training.optimizer", f"must be one of {', '.join(OPTIMIZERS)} for a parameter-server run", optimizer)
    run_dtype = dtype or training.get("dtype", "fp32")
    if run_dtype != "fp32":
        raise _err("--dtype", "the parameter-server executor runs fp32 (pass --dtype fp32)", run_dtype)
    notes = []
    if tiny:
        model = shrink(model)
        batch = TINY_BATCH_PER_WORKER * workers
    else:
        batch = training.get("global_batch_size")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0 or batch % workers:
            raise _err("training.global_batch_size", f"must be a positive multiple of the {workers} workers", batch)
    if ps.get("server_placement", "dedicated") == "colocated":
        notes.append("co-located servers: on one machine every role is a process of this host either way")
    lr = training.get("learning_rate", default_learning_rate(optimizer))
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        raise _err("training.learning_rate", "must be a positive number", lr)
    return PsConfig(
        name=str((plan.get("model") or {}).get("name", "plan"))[:64], model=model, mode=mode, synchronous=synchronous,
        servers=servers, workers=workers, server_placement=str(ps.get("server_placement", "dedicated")),
        server_tensors=tuple(server_tensors), pieces=tuple(place(model, server_tensors, sharding, servers, where)),
        optimizer=optimizer, learning_rate=float(lr), global_batch_size=batch, steps=steps, seed=seed, tiny=tiny,
        notes=tuple(notes), replicas=replicas)


def default_learning_rate(optimizer: str) -> float:
    """SGD: DLRM's default --learning-rate 0.01 (facebookresearch/dlrm dlrm_s_pytorch.py); Adagrad,
    Adam, AdamW: PyTorch's defaults (torch.optim docs: 0.01, 1e-3, 1e-3)."""
    return {"sgd": 0.01, "adagrad": 0.01, "adam": 1e-3, "adamw": 1e-3}[optimizer]
