"""A torch-free test handler that leaks memory on request.

``leak N`` keeps N MiB (touched, so resident) for the life of the worker process; every answer
reports the worker's pid, resident memory and USS (its own pages: what ``workerMaxRssMb`` caps).
Anything else just answers.
"""

import os

_KEPT: list[bytes] = []


def _uss_mib():
    """Private_Clean + Private_Dirty of /proc/self/smaps_rollup, in MiB."""
    kib = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                kib += int(line.split()[1])
    return kib / 1024


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body", row.get("data"))
        text = body.decode() if isinstance(body, (bytes, bytearray)) else str(body)
        if text.startswith("leak "):
            _KEPT.append(b"\x01" * (int(text.split()[1]) << 20))
        out.append({"pid": os.getpid(), "rss_mib": _rss_mib(), "uss_mib": _uss_mib()})
    return out
