"""The contract between the frontend and its workers: both processes import this, and it imports
only the standard library and numpy (never torch, never the rest of ``serve``).

Frames and the shared-memory arena (`frames`, `shm`), the typed messages inside the frames
(`messages`: the worker spec, PREDICT items, RESULT and PARTIAL items), the worker's log lines
(`log_records`), the error tree and its codes (`errors`, `redact`), request JSON (`json_input`),
tensor codecs and the protocol bodies they carry (`tensors`, `tensor_params`, `oip`, `kserve_v1`).
The names below tell a worker which protocol a batch speaks without importing numpy.
"""

from __future__ import annotations

# The frontend <-> worker contract for protocol requests (see ``serve.wire.tensor_params``). These
# names live here, free of numpy, so a worker can tell protocol batches apart without importing it.
PROTOCOL_HEADER = "x-lantern-protocol"
OUTPUTS_HEADER = "x-lantern-outputs"
PARAMETERS_HEADER = "x-lantern-parameters"
OIP_ID_HEADER = "x-lantern-oip-id"  # the OIP request's own "id", for a handler given its JSON
MAX_ELEMENTS_HEADER = "x-lantern-max-elements"  # KServe v1: max_request_elements, for the worker
OIP = "oip"
KSERVE_V1 = "kserve-v1"
METADATA = "metadata"
KINDS = frozenset({OIP, KSERVE_V1, METADATA})
