"""Shared fixtures. Servers are real processes on free loopback ports, one per test module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Every server a test starts (by the helper or by `serve start`) serves gRPC on free ports, never
# on TorchServe's 7070/7071, which other test runs on this machine may hold.
os.environ.setdefault("LANTERN_GRPC_INFERENCE_PORT", "0")
os.environ.setdefault("LANTERN_GRPC_MANAGEMENT_PORT", "0")

from tests.support.server import DATA


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def kitten() -> bytes:
    return (DATA / "kitten.jpg").read_bytes()


@pytest.fixture(scope="session")
def coffee() -> bytes:
    return (DATA / "coffee.jpg").read_bytes()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """``@pytest.mark.anyio`` tests run on asyncio, the loop Lantern runs on. anyio's own fixture
    would add trio wherever trio is installed (selenium, for the console's browser tests, pulls
    it in), and nothing here is written for trio."""
    return "asyncio"
