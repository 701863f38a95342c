"""TorchServe workflows (.war): a DAG of model and function nodes, served through the registry.

The frontend only routes bytes between nodes: every node, function nodes included, is a model
version with its own queue, batcher and workers (``<workflow>__<node>``).
"""
