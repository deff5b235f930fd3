"""Warnings about the inputs of an estimate or a search that are legal but easy to get wrong.

``estimate`` and ``recommend`` print them on stderr and carry them in ``--json`` output as
``"warnings"``: what the profile loader assumed (advisor.specs.hardware.HardwareProfile.notes, e.g. a
reference GEMM curve) and a cluster whose last node is partial.
"""

from __future__ import annotations

from advisor.specs.hardware import HardwareProfile
from advisor.specs.job import Cluster


def partial_node_warning(hardware: HardwareProfile, cluster: Cluster) -> str | None:
    """A sentence when the device count is not a whole number of nodes, else None.

    Ranks fill nodes in order (advisor.cost.placement), so the last node is partly used and a group
    that reaches into it may cross nodes where a whole-node layout would not."""
    per_node = hardware.node.devices_per_node
    if cluster.devices % per_node == 0:
        return None
    full, rest = divmod(cluster.devices, per_node)
    layout = (f"{full} full node{'s' if full != 1 else ''} and {rest} of the {per_node} devices of one more"
              if full else f"{rest} of the {per_node} devices of one node")
    return (f"{cluster.devices} devices are not a whole number of {hardware.name} nodes ({per_node} devices each): "
            f"advisor assumes {layout}, filled in rank order")


def input_warnings(hardware: HardwareProfile, cluster: Cluster) -> list[str]:
    """Every warning about these inputs, the profile's own notes first."""
    out = list(hardware.notes)
    partial = partial_node_warning(hardware, cluster)
    if partial is not None:
        out.append(partial)
    return out
