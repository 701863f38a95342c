"""A torch-free custom handler for the protocol tests: shows what custom handlers receive.

OIP rows are ``{input name: numpy array}``; it answers ``scaled`` (x * factor, ``factor`` from
model-config.yaml), x's ``dtype``, the ``batch`` size it was called with and the request's OIP
``parameters``; an OIP parameter ``hold_seconds`` makes it sleep that long first (a busy worker
that requests queue behind). KServe v1 rows are ``{"data": value}`` or named values; it answers
a description of each row (types, lengths of bytes, the factor). Explain requests get the row's
keys.
"""

import json
import time

import numpy as np


def handle(data, context):
    if data is None:
        return None
    factor = float(context.model_yaml_config.get("factor", 1))
    out = []
    for idx, row in enumerate(data):
        protocol = context.get_request_header(idx, "x-lantern-protocol")
        if context.get_request_header(idx, "explain") == "True":
            out.append({"explained": sorted(row)})
        elif protocol == "oip":
            x = row["x"]
            x[...] = x  # the arrays are writable copies
            parameters = context.get_request_header(idx, "x-lantern-parameters") or "{}"
            time.sleep(float(json.loads(parameters).get("hold_seconds") or 0))
            out.append(
                {
                    "scaled": (x * factor).astype(np.float32),
                    "dtype": np.array([str(x.dtype)], dtype=object),
                    "batch": np.array([len(data)], dtype=np.int32),
                    "parameters": np.array([parameters], dtype=object),
                }
            )
        else:
            out.append(
                {
                    key: (
                        {"bytes": len(value), "head": value[:4].hex()}
                        if isinstance(value, bytes)
                        else {"type": type(value).__name__, "value": value, "factor": factor}
                    )
                    for key, value in row.items()
                }
            )
    return out
