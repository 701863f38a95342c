"""Shared fixtures. Servers are real processes on free loopback ports, one per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

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
