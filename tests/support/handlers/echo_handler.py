"""A torch-free test handler: echoes each row and reports the batch it ran in.

Body commands (text): ``boom`` raises ValueError, ``sleep S`` sleeps S seconds, ``crash`` kills the
worker process, ``status N`` answers with HTTP status N via the context. Anything else is echoed.
"""

import os
import time


def handle(data, context):
    if data is None:  # TorchServe's initialisation call
        return None
    out = []
    for idx, row in enumerate(data):
        body = row.get("body", row.get("data"))
        if isinstance(body, (bytes, bytearray)):
            body = body.decode(errors="replace")
        text = body if isinstance(body, str) else None
        if text == "boom":
            raise ValueError("boom requested")
        if text == "crash":
            os._exit(3)
        if text and text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
        if text and text.startswith("status "):
            context.set_response_status(int(text.split()[1]), "set by handler", idx)
        out.append(
            {
                "echo": body,
                "batch": len(data),
                "pid": os.getpid(),
                "request_id": context.get_request_id(idx),
                "url_path": context.get_request_header(idx, "url_path"),
                "explain": context.get_request_header(idx, "explain"),
                "threads": context.system_properties.get("num_threads"),
                "gpu_id": context.system_properties.get("gpu_id"),
                "cpus": sorted(os.sched_getaffinity(0)),
                "query": {
                    k: (v.decode() if isinstance(v, (bytes, bytearray)) else v)
                    for k, v in row.items()
                    if k not in ("body", "data")
                },
            }
        )
    return out
