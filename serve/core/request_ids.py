"""Request ids for the hot path: UUID-shaped, unique per server, without a syscall per request.

``uuid.uuid4()`` reads ``os.urandom`` (a system call) for every request. Here each process draws
74 random bits once, as a version-4 UUID whose last 48 bits are then a counter: the ids look like
and parse as UUIDs, never repeat within a process (2**48 requests), and two processes (or one
restarted) share a prefix with probability ~2**-74 per pair.
"""

from __future__ import annotations

import itertools
import os
import uuid

_prefix = ""
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix = str(uuid.uuid4())[:24]  # "xxxxxxxx-xxxx-4xxx-yxxx-": version and variant kept
    _counter = itertools.count(int.from_bytes(os.urandom(2), "big"))


def new_request_id() -> str:
    """A fresh id such as ``3f1c2a9e-0b4d-4e6f-9a21-00000000a3c1``."""
    return f"{_prefix}{next(_counter) & 0xFFFFFFFFFFFF:012x}"


_reseed()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)  # a forked child must not repeat our ids
