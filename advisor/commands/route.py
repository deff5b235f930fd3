"""Which command implementation serves a request (advisor.cli): a mixed cluster
(advisor.commands.mixed_cli), a supernet (advisor.commands.supernet), or the regular path (returns False)."""

from __future__ import annotations

from typing import Any


def route(command: str, options: dict[str, Any]) -> bool:
    """Run ``command`` ("recommend" or "estimate") on a mixed cluster or for a supernet; True when done."""
    from advisor.specs.mixed import is_mixed

    if command == "estimate" and options.get("plan") is not None:
        from advisor.plan import read_plan_dict

        data = read_plan_dict(options["plan"])
        if isinstance(data.get("hardware"), list):        # a mixed cluster's parts
            from advisor.commands.mixed_cli import estimate_mixed_cmd

            estimate_mixed_cmd(options)
            return True
        model = data.get("model")
        if isinstance(model, dict) and model.get("family") == "supernet":
            from advisor.commands.supernet import estimate_supernet_cmd

            estimate_supernet_cmd(options)
            return True
        return False
    if is_mixed(options.get("hardware")):
        from advisor.commands import mixed_cli

        (mixed_cli.recommend_mixed_cmd if command == "recommend" else mixed_cli.estimate_mixed_cmd)(options)
        return True
    from advisor.commands.supernet import is_supernet

    if is_supernet(options.get("model")):
        from advisor.commands import supernet

        (supernet.recommend_supernet_cmd if command == "recommend" else supernet.estimate_supernet_cmd)(options)
        return True
    return False
