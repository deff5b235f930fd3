"""Supernet training on a pipeline of CPU ranks with NASPipe's schedule (advisor.cost.naspipe), checked
against sequential training of the same subnets (advisor.executor.supernet.run)."""
