"""A torch-free handler that answers any input of any protocol (the fuzz tests' target model).

Open Inference Protocol rows: the element count of all inputs, as a tensor. Anything else: the
sorted names of the row's inputs. Whatever reaches it is well-formed by then: what it proves is
that the server's own decoding and answering hold up.
"""

import numpy as np


def handle(data, context):
    if data is None:
        return None
    out = []
    for idx, row in enumerate(data):
        if context.get_request_header(idx, "x-lantern-protocol") == "oip":
            count = sum(int(np.asarray(v).size) for v in row.values())
            out.append({"count": np.array([count], dtype=np.int64)})
        else:
            out.append({"inputs": sorted(str(k) for k in row)})
    return out
