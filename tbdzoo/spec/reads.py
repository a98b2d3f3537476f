"""What a value of a graph depends on: the one walk back through its nodes (programs,
derivatives, backends and the profilers read it). Valid Python 3.6."""


def values_read(graph, names):
    """Every node and input that ``names`` depend on (themselves included)."""
    needed = set(names)
    for node in reversed(list(graph.nodes.values())):
        if node.name in needed:
            needed.update(node.inputs)
    return needed
