"""Inference protocol codecs (Open Inference Protocol v2, KServe v1 / TF Serving REST).

Pure Python and numpy, never torch: the frontend uses them to parse requests and build responses,
the worker (``handlers/tensor_path.py``) to decode tensors and encode results.
"""

from __future__ import annotations

# The frontend <-> worker contract for protocol requests (see ``serve.protocols.wire``). These
# names live here, free of numpy, so a worker can tell protocol batches apart without importing it.
PROTOCOL_HEADER = "x-lantern-protocol"
OUTPUTS_HEADER = "x-lantern-outputs"
PARAMETERS_HEADER = "x-lantern-parameters"
MAX_ELEMENTS_HEADER = "x-lantern-max-elements"  # KServe v1: max_request_elements, for the worker
OIP = "oip"
KSERVE_V1 = "kserve-v1"
METADATA = "metadata"
KINDS = frozenset({OIP, KSERVE_V1, METADATA})
