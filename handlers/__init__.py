"""Lantern worker-side handler runtime: TorchServe's handler contract, in pure Python.

Imported only in worker processes. Nothing here imports torch at package import time; the
modules that need it (``base_handler``, ``runtimes``, the default handlers) import it themselves.
"""
