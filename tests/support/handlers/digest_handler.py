"""A test handler for large bodies: answers each row's length, SHA-256 and type, and what this
worker maps of a shared-memory arena (``serve.wire.shm``).

``model-config.yaml`` ``digest: {torch: true}`` imports torch at load (so the server's warm spares
preload it and a replacement worker comes from a spare). A body that starts with ``wait:PATH\\n``
creates ``PATH.started``, then waits (up to 120 s) for ``PATH.release`` to exist: tests wait on the
files, never on time (to queue a batch behind it, or to kill the worker while it holds one).
"""

import hashlib
import os
import time


def arena_mapping():
    """The permissions and resident KiB of this process's arena mapping, or None."""
    perms, rss, inside = None, 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5].startswith("/memfd:lantern-arena")
                if inside:
                    perms = fields[1]
            elif inside and fields[0] == "Rss:":
                rss += int(fields[1])
    return None if perms is None else {"perms": perms, "rss_kb": rss}


def handle(data, context):
    if data is None:  # TorchServe's initialisation call
        if (context.model_yaml_config.get("digest") or {}).get("torch"):
            import torch  # noqa: F401
        return None
    out = []
    for row in data:
        body = row.get("body", row.get("data"))
        if body.startswith(b"wait:"):
            path = body[5 : body.index(b"\n")].decode()
            open(path + ".started", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(path + ".release") and time.monotonic() < deadline:
                time.sleep(0.01)
        out.append(
            {
                "n": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "type": type(body).__name__,
                "batch": len(data),
                "pid": os.getpid(),
            }
        )
    for row in out:
        row["arena"] = arena_mapping()  # after every row was read
    return out
