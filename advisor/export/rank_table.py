"""Ascend HCCL rank table (format version 1.0) and the placeholder addresses the launchers write.

The rank table follows MindSpore's "rank table Startup" tutorial
(https://www.mindspore.cn/tutorials/en/master/parallel/rank_table.html; mirrored as
mindspore-ai/docs tutorials/source_en/parallel/rank_table.md): every value a string; ``version``
"1.0", ``server_count``, ``server_list`` of ``{server_id, device: [{device_id, device_ip, rank_id}],
host_nic_ip: "reserve"}`` and ``status`` "completed". ``device_id`` is the card's physical number in
its server, ``rank_id`` the logical number, from 0; with several servers the order of ``rank_id``
must follow the dictionary order of ``server_id``.

HCCS groups: on the Atlas training series (Ascend 910, profile ascend-910: node topology
mesh-groups of 4) "cards 0-3 and 4-7 each form one network" and a server takes part with 1, 2, 4 or
8 ranks, 2 or 4 of them inside one group, every server with the same number (Huawei CANN HCCL
Python API, create_group constraints:
https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/80RC3alpha003/apiref/hcclapiref/hcclpython_07_0002.html).
The Atlas A2 series (910B: HCCS full mesh) has no such rule inside a server.

Addresses are placeholders the user replaces: RFC 5737 documentation ranges (TEST-NET-1 192.0.2.0/24
for servers, TEST-NET-2 198.51.100.0/24 and TEST-NET-3 203.0.113.0/24 for device NICs), then the
RFC 2544 benchmarking range 198.18.0.0/15 when a cluster outgrows them (RFC 6890: neither is ever
a real Internet host). Server placeholders have fixed-width octets (100..254), so their dictionary
order is their node order, as the rank table requires.
"""

from __future__ import annotations

import ipaddress

from advisor.errors import AdvisorError
from advisor.specs.hardware import HardwareProfile

RANK_TABLE_VERSION = "1.0"      # the rank table tutorial's format version
RANK_TABLE_STATUS = "completed"
HOST_NIC_IP = "reserve"         # the tutorial's value for the reserved host NIC field
# Atlas training series (Ascend 910): ranks a server may take part with (CANN create_group constraints)
ATLAS_910_RANKS_PER_SERVER = (1, 2, 4, 8)

PLACEHOLDER_RANGES_TEXT = ("RFC 5737 documentation addresses: 192.0.2.x for servers, 198.51.100.x and 203.0.113.x "
                           "for device NICs, 198.18.0.0/15 (RFC 2544) beyond those")


def _fixed_width(prefix: str, count: int) -> list[str]:
    return [f"{prefix}.{last}" for last in range(100, 100 + count)]


def placeholder_server_addresses(count: int) -> list[str]:
    """Addresses for `count` servers, in node order and in dictionary order."""
    out = _fixed_width("192.0.2", 155)                       # 192.0.2.100 .. 192.0.2.254
    for third in range(100, 256):                            # 198.18.100.100 .. 198.18.255.254
        if len(out) >= count:
            break
        out += _fixed_width(f"198.18.{third}", 155)
    if count > len(out):
        raise AdvisorError(f"cluster.nodes = {count}: more servers than the placeholder address ranges hold "
                           f"({len(out)}); give the hosts")
    return out[:count]


def placeholder_device_addresses(count: int) -> list[str]:
    """`count` distinct addresses for device NICs (no order requirement)."""
    out = [f"198.51.100.{i}" for i in range(1, 255)] + [f"203.0.113.{i}" for i in range(1, 255)]
    for third in range(256):                                 # 198.19.0.1 .. 198.19.255.254
        if len(out) >= count:
            break
        out += [f"198.19.{third}.{i}" for i in range(1, 255)]
    if count > len(out):
        raise AdvisorError(f"cluster.devices = {count}: more devices than the placeholder address ranges hold "
                           f"({len(out)})")
    return out[:count]


def is_placeholder(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net) for net in
               ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "198.18.0.0/15"))


def is_ascend(hardware: HardwareProfile) -> bool:
    return hardware.device.name.lower().startswith("ascend")


def hccs_groups(hardware: HardwareProfile) -> tuple[tuple[int, ...], ...]:
    """Device ids of each HCCS group of one server: the profile's mesh groups (0-3 and 4-7 on the 910),
    or one group of the whole server when HCCS joins all of its devices."""
    node = hardware.node
    size = node.group_size if node.topology == "mesh-groups" else node.devices_per_node
    return tuple(tuple(range(start, min(start + size, node.devices_per_node)))
                 for start in range(0, node.devices_per_node, size))


def hccs_problems(hardware: HardwareProfile, counts: list[int]) -> list[str]:
    """Unsupported-feature sentences for per-server device counts HCCL refuses on grouped servers."""
    if len(hccs_groups(hardware)) < 2:
        return []
    problems = []
    bad = sorted({c for c in counts if c not in ATLAS_910_RANKS_PER_SERVER})
    if bad:
        problems.append(f"cluster.devices = {sum(counts)} on {len(counts)} servers puts {', '.join(map(str, bad))} "
                        f"devices on a server: HCCL on {hardware.device.name} servers takes 1, 2, 4 or 8 (CANN "
                        "create_group constraints); change the device count")
    if len(set(counts)) > 1:
        problems.append(f"cluster.devices = {sum(counts)}: servers with {sorted(set(counts))} devices; HCCL on "
                        f"{hardware.device.name} servers needs the same number on every server")
    return problems


def rank_table(server_ids: list[str], counts: list[int], device_ips: list[str]) -> dict:
    """The rank table for servers with `counts[i]` devices each (device ids 0.., rank ids contiguous in
    server order). `device_ips` has one address per device, in rank order."""
    if len(device_ips) != sum(counts) or len(server_ids) != len(counts):
        raise ValueError("one server id per server and one device ip per device")
    servers, rank = [], 0
    for server_id, count in zip(server_ids, counts):
        devices = []
        for device_id in range(count):
            devices.append({"device_id": str(device_id), "device_ip": device_ips[rank], "rank_id": str(rank)})
            rank += 1
        servers.append({"server_id": server_id, "device": devices, "host_nic_ip": HOST_NIC_IP})
    return {"version": RANK_TABLE_VERSION, "server_count": str(len(servers)), "server_list": servers,
            "status": RANK_TABLE_STATUS}
