"""The shared core: model loading, task data, node names, metrics, figures and reports."""

from circuits.nodes import MLP, Head, Node, all_heads, all_mlps, all_nodes, parse_node, validate_nodes

__all__ = ["Head", "MLP", "Node", "all_heads", "all_mlps", "all_nodes", "parse_node", "validate_nodes"]
