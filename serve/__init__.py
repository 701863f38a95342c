"""Lantern: a pure-Python model server that serves TorchServe archives and handlers."""

__version__ = "0.1.0"
