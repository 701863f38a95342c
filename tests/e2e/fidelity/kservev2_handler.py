"""A handler written for TorchServe's ``kservev2`` envelope (a stand-in for KServe's v2 examples).

The envelope hands it one dict per input tensor (``name``, ``shape``, ``datatype``, ``data``) and
names each returned value after its input. It doubles each input; with ``explain: True`` it
answers each input's sum instead.
"""

import numpy as np


def handle(data, context):
    if data is None:
        return None
    explain = context.get_request_header(0, "explain") == "True"
    out = []
    for tensor in data:
        values = np.asarray(tensor.get("data") or tensor.get("body"), dtype=np.float32)
        out.append([float(values.sum())] if explain else (values * 2).tolist())
    return out
