"""A torch-free test handler answering, per request, the request headers a test asks about.

The body is ignored unless it is ``sleep S`` (sleeps S seconds first). The answer is JSON:
``{"input": <the data/body parameter as text>, "headers": {name: value or null}}`` for the
sequence headers, ``x-request-id`` and a ``session_id`` a client may send as metadata.
"""

import json
import time

NAMES = (
    "ts_request_sequence_id",
    "ts_request_sequence_start",
    "ts_request_sequence_end",
    "x-request-id",
    "session_id",
)


def handle(data, context):
    if data is None:
        return None
    out = []
    for idx, row in enumerate(data):
        body = row.get("data", row.get("body"))
        text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else body
        if isinstance(text, str) and text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
        headers = {name: context.get_request_header(idx, name) for name in NAMES}
        out.append(json.dumps({"input": text, "headers": headers}))
    return out
