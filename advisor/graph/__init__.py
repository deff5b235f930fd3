"""Operator graphs for the operator-level searchers: transformer graphs built from a model
description, and generic graphs loaded from JSON (format: advisor/graph/README.md)."""

from advisor.graph.graph import Edge, Link, Operator, OperatorGraph, Tensor
from advisor.graph.loader import bundled_graphs, graph_from_dict, load_graph
from advisor.graph.transformer import transformer_graph

__all__ = ["Edge", "Link", "Operator", "OperatorGraph", "Tensor", "bundled_graphs", "graph_from_dict", "load_graph",
           "transformer_graph"]
