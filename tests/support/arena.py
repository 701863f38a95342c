"""What a process holds of the workers' shared-memory arenas (`serve.wire.shm`), read from /proc."""

from __future__ import annotations

import os


def arena_mappings(pid: int | str = "self") -> list[tuple[str, int]]:
    """Each arena mapping of process ``pid``: its permissions and resident KiB."""
    found: list[tuple[str, int]] = []
    inside = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5].startswith("/memfd:lantern-arena")
                if inside:
                    found.append((fields[1], 0))
            elif inside and fields[0] == "Rss:":
                found[-1] = (found[-1][0], int(fields[1]))
    return found


def arena_fds(pid: int | str = "self") -> int:
    """How many of process ``pid``'s descriptors are arenas."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:lantern-arena")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
    return count


def fd_count(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
