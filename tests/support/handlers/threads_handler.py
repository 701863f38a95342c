"""A torch handler that answers with the intra-op threads its worker runs on right now."""

import os

import torch


def handle(data, context):
    if data is None:  # TorchServe's initialisation call
        return None
    threads = torch.get_num_threads()
    return [{"threads": threads, "pid": os.getpid()} for _ in data]
