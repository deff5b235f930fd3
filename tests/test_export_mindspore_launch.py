"""MindSpore launchers: msrun, dynamic cluster, mpirun + hostfile, and the Ascend HCCL rank table.

Checked against MindSpore's startup tutorials (mindspore-ai/docs tutorials/source_en/parallel/:
msrun_launcher.md, dynamic_cluster.md, mpirun.md, rank_table.md). The rank table is validated with
RANK_TABLE_SCHEMA, written from rank_table.md's format (every value a string; version "1.0";
server_count; server_list of {server_id, device: [{device_id, device_ip, rank_id}], host_nic_ip};
status "completed"): by a small validator here and, where it is installed, by jsonschema.

The scripts are not only parsed (bash -n): they are run with stand-ins for msrun, mpirun and python
on PATH that record their arguments and environment, so the tests see the exact commands and
variables each node would start.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from dataclasses import replace

import pytest

from _export_plans import make_plan, plans
from advisor.errors import AdvisorError
from advisor.export import export_plan
from advisor.export.mindspore_launch import FILES, LaunchOptions, launch_files
from advisor.export.rank_table import is_placeholder, placeholder_device_addresses, placeholder_server_addresses

IPV4 = {"type": "string", "pattern": r"^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
                                     r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$"}
NUMBER = {"type": "string", "pattern": r"^(0|[1-9][0-9]*)$"}
RANK_TABLE_SCHEMA = {  # rank_table.md, "Related Configurations" and the 16-card multi-machine example
    "type": "object",
    "required": ["version", "server_count", "server_list", "status"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": "1.0"},
        "server_count": {"type": "string", "pattern": r"^[1-9][0-9]*$"},
        "status": {"const": "completed"},
        "server_list": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["server_id", "device"],
            "additionalProperties": False,
            "properties": {
                "server_id": IPV4,
                "host_nic_ip": {"const": "reserve"},
                "device": {"type": "array", "minItems": 1, "maxItems": 8, "items": {
                    "type": "object",
                    "required": ["device_id", "device_ip", "rank_id"],
                    "additionalProperties": False,
                    "properties": {"device_id": {"type": "string", "pattern": r"^[0-7]$"}, "device_ip": IPV4,
                                   "rank_id": NUMBER},
                }},
            },
        }},
    },
}
# msrun_launcher.md parameter table (the same names as argparse in mindspore/parallel/cluster/run.py)
MSRUN_FLAGS = {"worker_num", "local_worker_num", "master_addr", "master_port", "node_rank", "log_dir", "join",
               "cluster_time_out", "bind_core", "sim_level", "sim_rank_id", "rank_table_file", "worker_log_name",
               "tail_worker_log"}
_TYPES = {"object": dict, "array": list, "string": str}


def schema_errors(value, schema, path="$") -> list[str]:
    """The subset of JSON Schema that RANK_TABLE_SCHEMA uses."""
    errors = []
    if "const" in schema and value != schema["const"]:
        return [f"{path}: {value!r} != {schema['const']!r}"]
    if "type" in schema and not isinstance(value, _TYPES[schema["type"]]):
        return [f"{path}: not a {schema['type']}"]
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        errors += [f"{path}: missing {k}" for k in schema.get("required", ()) if k not in value]
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: unexpected {k}" for k in value if k not in props]
        for k, sub in props.items():
            if k in value:
                errors += schema_errors(value[k], sub, f"{path}.{k}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def validate_rank_table(doc) -> None:
    assert schema_errors(doc, RANK_TABLE_SCHEMA) == []
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(doc, RANK_TABLE_SCHEMA)


def _plan(hardware: str, nodes: int, dp: int, tp: int, *, devices: int | None = None, dtype: str = "bf16"):
    return make_plan("llama3-8b", hardware, nodes,
                     {"dp": dp, "tp": tp, "pp": 1, "micro_batch_size": 1, "num_micro_batches": 4, "zero_stage": 1},
                     devices=devices, global_batch_size=4 * dp, seq_length=4096, dtype=dtype, framework="mindspore")


@pytest.fixture(scope="module")
def ascend():
    """1-, 2- and 4-node Ascend 910B plans: name -> (plan, files, notes, unsupported)."""
    out = {}
    for nodes, dp, tp in ((1, 2, 4), (2, 4, 4), (4, 8, 4)):
        plan = _plan("ascend-910b", nodes, dp, tp)
        notes, unsupported = [], []
        out[nodes] = (plan, launch_files(plan, notes, unsupported), notes, unsupported)
    return out


def _write(files: dict[str, str], folder) -> None:
    for name, body in files.items():
        (folder / name).write_text(body)


def _fake_bin(folder, out):
    """msrun, mpirun and python stand-ins: each writes its argv (and the launch variables) as JSON."""
    folder.mkdir()
    body = ('#!/usr/bin/env python3\nimport json, os, sys\n'
            'keys = ("MS_ROLE", "MS_NODE_ID", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT", "DEVICE_ID", '
            '"RANK_ID", "RANK_SIZE", "RANK_TABLE_FILE")\n'
            'env = {k: os.environ[k] for k in keys if k in os.environ}\n'
            f'tag = "-".join([os.path.basename(sys.argv[0]), env.get("MS_NODE_ID", ""), env.get("RANK_ID", ""), '
            f'env.get("MS_ROLE", "")])\n'
            f'open(os.path.join({str(out)!r}, tag + ".json"), "w").write(json.dumps({{"argv": sys.argv[1:], '
            '"env": env}))\n')
    for name in ("msrun", "mpirun", "python"):
        path = folder / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def _run(tmp_path, files, script, *args, env=None):
    """Run one exported script in a fresh folder with the stand-ins; the records it left, by tag."""
    work = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    work.mkdir()
    _write(files, work)
    records = work / "records"
    records.mkdir()
    fake = _fake_bin(work / "bin", records)
    run_env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "RANK_TABLE_FILE", "HOSTFILE")}
    run_env.update({"PATH": f"{fake}:{os.environ['PATH']}", **(env or {})})
    r = subprocess.run(["bash", str(work / script), *args], cwd=work, env=run_env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return {p.stem: json.loads(p.read_text()) for p in records.iterdir()}, work


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_scripts_parse(ascend, tmp_path):
    for nodes, (_, files, _, _) in ascend.items():
        folder = tmp_path / f"n{nodes}"
        folder.mkdir()
        _write(files, folder)
        for name in files:
            if name.endswith(".sh"):
                r = subprocess.run(["bash", "-n", str(folder / name)], capture_output=True, text=True)
                assert r.returncode == 0, (nodes, name, r.stderr)


def test_msrun_line_per_node(ascend, tmp_path):
    for nodes, (plan, files, _, _) in ascend.items():
        lines = re.findall(r"^\s+(\d+)\) (msrun .*) ;;$", files[FILES["msrun"]], re.M)
        assert [int(n) for n, _ in lines] == list(range(nodes))
        for node, line in lines:
            argv = shlex.split(line)
            flags = _flags(argv)
            assert set(flags) <= MSRUN_FLAGS and argv[0] == "msrun"
            assert flags["worker_num"] == str(plan.cluster.devices)
            assert flags["local_worker_num"] == "8" and flags["node_rank"] == node
            assert flags["join"] == "True" and flags["log_dir"] and int(flags["cluster_time_out"]) > 0
        # run it: msrun receives the flags, the master address and the training arguments
        last = nodes - 1
        records, _ = _run(tmp_path, files, FILES["msrun"], str(last), "--config", "my run.yaml")
        (record,) = records.values()
        flags = _flags(record["argv"])
        assert flags["node_rank"] == str(last) and flags["local_worker_num"] == "8"
        assert flags["master_addr"] == ("127.0.0.1" if nodes == 1 else "192.0.2.100")
        assert flags["master_port"] == "8118"
        assert record["argv"][-3:] == ["run_mindformer.py", "--config", "my run.yaml"]


def test_dynamic_cluster_roles(ascend, tmp_path):
    plan, files, _, _ = ascend[2]
    records, work = _run(tmp_path, files, FILES["worker"], "1", "--run_mode", "train")
    assert len(records) == 8
    ids = sorted(int(r["env"]["MS_NODE_ID"]) for r in records.values())
    assert ids == list(range(8, 16))                                # node 1 holds ranks 8..15
    for r in records.values():
        assert r["env"]["MS_ROLE"] == "MS_WORKER" and r["env"]["MS_WORKER_NUM"] == "16"
        assert r["env"]["MS_SCHED_HOST"] == "192.0.2.100" and r["env"]["MS_SCHED_PORT"] == "8118"
        assert r["argv"] == ["run_mindformer.py", "--run_mode", "train"]
    records, _ = _run(tmp_path, files, FILES["scheduler"], env={"MS_SCHED_HOST": "10.1.2.3"})
    (sched,) = records.values()
    assert sched["env"] == {"MS_ROLE": "MS_SCHED", "MS_WORKER_NUM": "16", "MS_SCHED_HOST": "10.1.2.3",
                            "MS_SCHED_PORT": "8118"}
    for bad in ("2", "08", "-1", "x; touch PWNED"):
        r = subprocess.run(["bash", str(work / FILES["worker"]), bad], cwd=work, capture_output=True, text=True)
        assert r.returncode == 2 and "NODE_RANK must be 0..1" in r.stderr, bad
    assert not (work / "PWNED").exists()


def test_mpirun_and_hostfile(ascend, tmp_path):
    for nodes, (plan, files, _, _) in ascend.items():
        hosts = [ln for ln in files[FILES["hostfile"]].splitlines() if ln and not ln.startswith("#")]
        assert len(hosts) == nodes
        for line in hosts:
            host, slots = line.split()
            assert slots == "slots=8" and (host == "localhost" if nodes == 1 else is_placeholder(host))
        records, work = _run(tmp_path, files, FILES["mpirun"], "--config", "x.yaml")
        (record,) = records.values()
        argv = record["argv"]
        assert argv[:4] == ["-n", str(plan.cluster.devices), "--hostfile", str(work / "hostfile")]
        assert argv[-4:] == ["python", "run_mindformer.py", "--config", "x.yaml"]
        assert "RANK_TABLE_FILE" not in record["env"]


def test_rank_table_format_and_ranks(ascend):
    for nodes, (plan, files, notes, _) in ascend.items():
        doc = json.loads(files[FILES["rank_table"]])
        validate_rank_table(doc)
        assert doc["server_count"] == str(nodes) and len(doc["server_list"]) == nodes
        ranks = []
        for server in doc["server_list"]:
            assert [d["device_id"] for d in server["device"]] == [str(i) for i in range(8)]
            ranks += [int(d["rank_id"]) for d in server["device"]]
            assert is_placeholder(server["server_id"])
        assert ranks == list(range(plan.cluster.devices))            # contiguous, in node order
        ids = [s["server_id"] for s in doc["server_list"]]
        assert ids == sorted(ids)                                    # rank order = dictionary order of server_id
        ips = [d["device_ip"] for s in doc["server_list"] for d in s["device"]]
        assert len(set(ips)) == len(ips) and all(is_placeholder(ip) for ip in ips)
        assert any("placeholders" in n and "rank_table.json" in n for n in notes)


def test_schema_refuses_a_broken_table(ascend):
    doc = json.loads(ascend[2][1][FILES["rank_table"]])
    doc["server_list"][0]["device"][0]["rank_id"] = 0               # a number, not a string
    del doc["status"]
    doc["server_list"][1]["device"][1]["device_ip"] = "192.0.2.999"
    assert len(schema_errors(doc, RANK_TABLE_SCHEMA)) == 3


def test_rank_table_launcher_sets_device_and_rank(ascend, tmp_path):
    _, files, _, _ = ascend[4]
    records, work = _run(tmp_path, files, FILES["rank_table_launch"], "3")
    assert sorted((int(r["env"]["DEVICE_ID"]), int(r["env"]["RANK_ID"])) for r in records.values()) == \
        [(i, 24 + i) for i in range(8)]
    for r in records.values():
        assert r["env"]["RANK_SIZE"] == "32" and r["env"]["RANK_TABLE_FILE"] == str(work / FILES["rank_table"])


def test_ascend_910_hccs_groups():
    plan = _plan("ascend-910", 2, 2, 8, dtype="fp16")
    notes, unsupported = [], []
    launch_files(plan, notes, unsupported)
    assert unsupported == []
    assert any("HCCS groups of devices 0-3 and 4-7" in n and "span both" in n for n in notes)
    odd = _plan("ascend-910", 1, 6, 1, devices=6, dtype="fp16")
    notes, unsupported = [], []
    launch_files(odd, notes, unsupported)
    assert any(u.startswith("cluster.devices") and "1, 2, 4 or 8" in u for u in unsupported)


def test_gpu_plans_skip_the_rank_table_and_uneven_nodes_drop_node_rank():
    plan = plans()["llama8b_partial_node"]                          # 9 devices on 2 A100 nodes
    notes, unsupported = [], []
    files = launch_files(plan, notes, unsupported)
    assert FILES["rank_table"] not in files and any("Ascend only" in n for n in notes)
    lines = re.findall(r"^\s+\d+\) (msrun .*) ;;$", files[FILES["msrun"]], re.M)
    assert [_flags(shlex.split(ln))["local_worker_num"] for ln in lines] == ["8", "1"]
    assert all("node_rank" not in _flags(shlex.split(ln)) for ln in lines)
    hosts = [ln.split()[1] for ln in files[FILES["hostfile"]].splitlines() if not ln.startswith("#")]
    assert hosts == ["slots=8", "slots=1"]


def test_hosts_option_and_quoting(ascend, tmp_path):
    plan = ascend[2][0]
    options = LaunchOptions(hosts=("10.0.0.5", "10.0.0.6"), master_port=29500, train_script="my train.py; touch PWNED")
    notes = []
    files = launch_files(plan, notes, [], options)
    assert [ln.split()[0] for ln in files[FILES["hostfile"]].splitlines() if not ln.startswith("#")] == \
        ["10.0.0.5", "10.0.0.6"]
    assert [s["server_id"] for s in json.loads(files[FILES["rank_table"]])["server_list"]] == ["10.0.0.5", "10.0.0.6"]
    records, work = _run(tmp_path, files, FILES["msrun"], "0")
    (record,) = records.values()
    assert _flags(record["argv"])["master_addr"] == "10.0.0.5" and _flags(record["argv"])["master_port"] == "29500"
    assert record["argv"][-1] == "my train.py; touch PWNED" and not (work / "PWNED").exists()
    for bad, match in (((" 10.0.0.5", "x"), "neither an IP address"), (("a;b", "c"), "neither an IP address"),
                       (("10.0.0.5",), "1 given for a plan on 2 nodes"), (("h", "h"), "twice"),
                       (("10.0.0.9", "10.0.0.10"), "dictionary order")):
        with pytest.raises(AdvisorError, match=match):
            launch_files(plan, [], [], LaunchOptions(hosts=bad))
    with pytest.raises(AdvisorError, match="master_port"):
        launch_files(plan, [], [], LaunchOptions(master_port=80))
    named = []
    files = launch_files(plan, named, [], LaunchOptions(hosts=("node-a", "node-b")))
    assert all(is_placeholder(s["server_id"]) for s in json.loads(files[FILES["rank_table"]])["server_list"])
    assert any("host names were replaced" in n for n in named)


def test_comments_cannot_break_out():
    plan = _plan("ascend-910b", 2, 4, 4)
    evil = replace(plan, model=replace(plan.model, name="x\nrm -rf ~ #\u2028"))
    files = launch_files(evil, [], [])
    for name, body in files.items():
        assert "\nrm -rf" not in body and "\u2028" not in body, name


def test_placeholder_ranges_scale():
    servers = placeholder_server_addresses(600)
    assert servers == sorted(servers) and len(set(servers)) == 600 and all(map(is_placeholder, servers))
    devices = placeholder_device_addresses(8 * 600)
    assert len(set(devices)) == 4800 and all(map(is_placeholder, devices))


def test_mindspore_export_writes_the_launchers():
    plan = plans()["gpt3_gpipe_fp16"]                               # 16 Ascend 910B nodes
    result = export_plan(plan, "mindspore")
    assert set(FILES.values()) <= set(result.files)
    doc = json.loads(result.files[FILES["rank_table"]])
    assert doc["server_count"] == "16" and sum(len(s["device"]) for s in doc["server_list"]) == 128
    assert any("placeholders" in n for n in result.notes)


def test_cli_hosts_and_master_port_reach_the_launchers(tmp_path):
    """advisor export --to mindspore --hosts A,B --master-port P: the msrun lines, the hostfile and the
    rank table use them (no placeholder note); refused for other targets and for a bad host."""
    import sys
    from pathlib import Path

    from advisor.plan import save_plan

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "plan.json"
    save_plan(_plan("ascend-910b", 2, 4, 4), path)

    def advisor(*args):
        return subprocess.run([sys.executable, "-m", "advisor", "export", str(path), *args], cwd=root,
                              capture_output=True, text=True, timeout=120)

    r = advisor("--to", "mindspore", "--hosts", "10.0.0.1,10.0.0.2", "--master-port", "29500", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    msrun = doc["files"][FILES["msrun"]]
    assert "10.0.0.1" in msrun and "29500" in msrun and "192.0.2." not in msrun
    assert [ln.split()[0] for ln in doc["files"][FILES["hostfile"]].splitlines() if ln and not ln.startswith("#")] \
        == ["10.0.0.1", "10.0.0.2"]
    table = json.loads(doc["files"]["rank_table.json"])
    assert [s["server_id"] for s in table["server_list"]] == ["10.0.0.1", "10.0.0.2"]
    placeholders = [n for n in doc["notes"] if "placeholders" in n]
    assert placeholders and all(n.startswith("rank_table.json: device_ip values are placeholders")
                                for n in placeholders)      # the servers are given; the device NICs are not
    for args, phrase in ((("--to", "megatron", "--hosts", "10.0.0.1,10.0.0.2"), "go with --to mindspore"),
                         (("--to", "mindspore", "--hosts", "10.0.0.1;reboot,10.0.0.2"), "hosts: entry 0"),
                         (("--to", "mindspore", "--master-port", "80"), "master_port")):
        r = advisor(*args)
        assert r.returncode == 2 and phrase in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
