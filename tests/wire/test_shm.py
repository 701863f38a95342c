"""The shared-memory arena's pure parts (allocator, frame references) and its memfd edge."""

from __future__ import annotations

import mmap
import os
import socket

import pytest

from serve.wire.frames import (
    Frame,
    MsgType,
    ProtocolError,
    encode_bytes,
    frames_from,
    move_to_shared,
    resolve_shared,
)
from serve.wire.shm import ALIGN, MARKER, Arena, BumpAllocator, receive_arena, send_arena

# ----- BumpAllocator ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "steps", "offsets"),
    [
        # (owner, length) allocates; (owner, None) frees that owner's space.
        (1024, [(1, 100), (1, 10)], [0, 128]),  # each start aligned to 64 bytes
        (1024, [(1, 1024)], [0]),  # exactly the arena
        (1024, [(1, 1025)], [None]),  # too big: inline, never an error
        (1024, [(1, 1000), (1, 100)], [0, None]),  # the rest does not fit
        (1024, [(1, 1000), (1, None), (2, 1000)], [0, None, 0]),  # empty again: back to 0
        (1024, [(1, 500), (2, 100), (1, None), (3, 100)], [0, 512, None, 640]),  # 2 still holds
        (1024, [(1, 500), (2, 100), (1, None), (2, None), (3, 900)], [0, 512, None, None, 0]),
        (1024, [(1, 0), (1, 0)], [0, 0]),  # empty payloads take no space
        (0, [(1, 1)], [None]),  # an arena of nothing
    ],
)
def test_the_allocator_bumps_and_resets_when_empty(
    size: int, steps: list[tuple[int, int | None]], offsets: list[int | None]
) -> None:
    alloc = BumpAllocator(size)
    got: list[int | None] = []
    for owner, length in steps:
        if length is None:
            alloc.free(owner)
            got.append(None)
        else:
            got.append(alloc.alloc(owner, length))
    assert got == offsets


def test_the_allocator_counts_bytes_in_use_and_frees_unknown_owners_quietly() -> None:
    alloc = BumpAllocator(4096)
    alloc.alloc(7, 100)
    alloc.alloc(7, 200)
    alloc.alloc(8, 50)
    assert alloc.in_use == 350
    alloc.free(99)  # a RESULT for a batch that placed nothing
    alloc.free(7)
    assert (alloc.in_use, alloc.top) == (50, 384 + ALIGN)  # 8's space stays where it is
    alloc.free(8)
    assert (alloc.in_use, alloc.top) == (0, 0)
    with pytest.raises(ValueError):
        alloc.alloc(1, -1)


# ----- frame references -------------------------------------------------------------------------


def predict(payloads: tuple[bytes, ...], **meta: object) -> Frame:
    return Frame(MsgType.PREDICT, 5, {"requests": [], **meta}, payloads)


def test_large_payloads_move_to_the_arena_and_come_back_as_bytearrays() -> None:
    arena = bytearray(1 << 16)
    alloc = BumpAllocator(len(arena))

    def place(payload: bytes) -> int | None:
        offset = alloc.alloc(5, len(payload))
        if offset is not None:
            arena[offset : offset + len(payload)] = payload
        return offset

    big1, small, big2, too_big = b"a" * 1000, b"tiny", b"b" * 3000, b"c" * (1 << 17)
    frame = move_to_shared(predict((big1, small, big2, too_big)), 1000, place)
    assert frame.meta["shm"] == [[0, 0, 1000], [2, 1024, 3000]]
    assert frame.payloads == (b"", small, b"", too_big)  # too big for the arena: inline
    (wire,) = frames_from([encode_bytes(frame)])  # the metadata survives the socket
    back = resolve_shared(wire, memoryview(bytes(arena)))
    assert back.payloads == (big1, small, big2, too_big)
    assert all(type(p) is bytearray for p in back.payloads[::2])
    assert "shm" not in back.meta


def test_a_frame_with_nothing_to_move_is_unchanged() -> None:
    frame = predict((b"x" * 10,))
    assert move_to_shared(frame, 100, lambda _: 0) is frame
    assert move_to_shared(frame, 1, lambda _: None) is frame  # nothing fitted
    assert resolve_shared(frame, None) is frame


ARENA = memoryview(bytes(range(256)) * 4)  # 1024 bytes


@pytest.mark.parametrize(
    ("refs", "payloads"),
    [
        ([[0, 1000, 25]], (b"",)),  # past the end
        ([[0, 1024, 1]], (b"",)),
        ([[0, -1, 10]], (b"",)),  # negative offset
        ([[0, 10, -5]], (b"",)),  # negative length
        ([[1, 0, 10]], (b"",)),  # no payload 1
        ([[-1, 0, 10]], (b"",)),
        ([[0, 0, 10], [0, 20, 10]], (b"",)),  # the same payload twice
        ([[0, 0, 10]], (b"inline too",)),  # both inline and shared
        ([[0, 0]], (b"",)),  # not a triple
        ([[0, 0, 1.5]], (b"",)),  # not integers
        ([[0, True, 10]], (b"",)),
        ([["0", 0, 10]], (b"",)),
        ([0, 0, 10], (b"",)),
        ({"0": [0, 10]}, (b"",)),  # not a list
        ([[0, 2**70, 10]], (b"",)),  # huge numbers from JSON
    ],
)
def test_a_bad_reference_is_a_protocol_error(refs: object, payloads: tuple[bytes, ...]) -> None:
    with pytest.raises(ProtocolError):
        resolve_shared(predict(payloads, shm=refs), ARENA)


def test_references_without_an_arena_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        resolve_shared(predict((b"",), shm=[[0, 0, 1]]), None)


def test_a_reference_to_the_last_byte_and_an_empty_one_resolve() -> None:
    frame = resolve_shared(predict((b"", b""), shm=[[0, 1023, 1], [1, 1024, 0]]), ARENA)
    assert frame.payloads == (bytearray(b"\xff"), bytearray())


# ----- the memfd arena --------------------------------------------------------------------------


def test_the_arena_is_sealed_against_shrinking_growing_and_writes_by_others() -> None:
    arena = Arena.create(1 << 20, "lantern-arena-test")
    assert arena is not None and arena.fd is not None
    try:
        assert os.fstat(arena.fd).st_size == 1 << 20
        assert arena.place(1, b"hello") == 0
        for attempt in (
            lambda: os.ftruncate(arena.fd, 4096),  # would SIGBUS the frontend's mapping
            lambda: os.ftruncate(arena.fd, 2 << 20),
            lambda: os.write(arena.fd, b"x"),
            lambda: mmap.mmap(arena.fd, 1 << 20, flags=mmap.MAP_SHARED),  # a writable mapping
        ):
            with pytest.raises(PermissionError):
                attempt()
        readonly = mmap.mmap(arena.fd, 1 << 20, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        assert readonly[:5] == b"hello"  # what the frontend writes, a reader sees
        readonly.close()
    finally:
        arena.close()
    assert arena.closed and arena.fd is None
    assert arena.place(2, b"late") is None  # a closed arena sends everything inline


def test_an_arena_of_zero_bytes_is_none() -> None:
    assert Arena.create(0) is None


def test_the_descriptor_crosses_a_socket_and_maps_read_only() -> None:
    arena = Arena.create(1 << 16)
    assert arena is not None and arena.fd is not None
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        arena.place(1, b"payload")
        send_arena(left, arena.fd)
        arena.close_fd()
        assert memfd_links() == 1  # the frontend's mapping keeps its own descriptor
        view = receive_arena(right, 1 << 16)
        # The received descriptor is closed; Python's mmap keeps a duplicate while it is mapped.
        assert memfd_links() == 2
        assert view[:7] == b"payload"
        with pytest.raises(TypeError):
            view[0] = 0  # mapped read-only
        view.close()
        arena.close()
        assert memfd_links() == 0
    finally:
        arena.close()
        left.close()
        right.close()


def memfd_links() -> int:
    """This process's descriptors of memfd arenas."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the directory's own descriptor, closed by now
            continue
    return sum(link.startswith("/memfd:lantern-arena") for link in links)


@pytest.mark.parametrize("size", [1 << 15, 1 << 17])
def test_receiving_an_arena_of_another_size_fails(size: int) -> None:
    arena = Arena.create(1 << 16)
    assert arena is not None and arena.fd is not None
    left, right = socket.socketpair()
    try:
        send_arena(left, arena.fd)
        with pytest.raises(ProtocolError):
            receive_arena(right, size)
    finally:
        arena.close()
        left.close()
        right.close()


def test_receiving_anything_but_the_marker_fails() -> None:
    left, right = socket.socketpair()
    try:
        left.sendall(b"x" * len(MARKER))  # a frame, no descriptor
        with pytest.raises(ProtocolError):
            receive_arena(right, 1 << 16)
    finally:
        left.close()
        right.close()


# ----- configuration ----------------------------------------------------------------------------


def test_the_arena_keys_have_defaults_come_from_the_environment_and_are_checked() -> None:
    from serve.config import Config, ConfigError

    default = Config.load(env={})
    assert (default.worker_shm_arena_mb, default.worker_shm_threshold_kb) == (128, 64)
    env = {"LANTERN_WORKER_SHM_ARENA_MB": "0", "LANTERN_WORKER_SHM_THRESHOLD_KB": "256"}
    off = Config.load(env=env)
    assert (off.worker_shm_arena_mb, off.worker_shm_threshold_kb) == (0, 256)
    for bad in ({"worker_shm_arena_mb": -1}, {"worker_shm_threshold_kb": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Config.from_mapping(bad)
