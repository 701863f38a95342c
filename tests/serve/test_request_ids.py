"""Hot-path request ids: UUID-shaped, unique within a process, and distinct in a forked child."""

from __future__ import annotations

import os
import uuid

from serve.core.request_ids import new_request_id


def test_ids_parse_as_version_4_uuids_and_do_not_repeat() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for rid in ids[:3] + ids[-3:]:
        parsed = uuid.UUID(rid)
        assert str(parsed) == rid
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_a_forked_child_draws_its_own_prefix() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: send one id and leave at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child_id[:24] != new_request_id()[:24]
