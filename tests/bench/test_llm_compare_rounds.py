"""bench.llm_compare's order of runs: servers, levels and rounds, without a server (``drive``
replaced by a recorder)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import llm_compare
from bench.llm_compare import Running, run_servers


def _args(interleave: bool, rounds: int, hogs: int = 0) -> argparse.Namespace:
    return argparse.Namespace(interleave=interleave, rounds=rounds, concurrency="1,32", hogs=hogs)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def drive(args: argparse.Namespace, server: Running, concurrency: str) -> list[Any]:
        calls.append((server.name, concurrency))
        return [{"concurrency": int(c), "n": len(calls)} for c in concurrency.split(",")]

    monkeypatch.setattr(llm_compare, "drive", drive)
    return calls


def _ups(events: list[str]) -> list[contextlib.AbstractContextManager[Running]]:
    @contextlib.contextmanager
    def up(name: str) -> Iterator[Running]:
        events.append(f"start {name}")
        yield Running(name, "http://127.0.0.1:1/v1", "m", 1, "ignore_eos", Path("/dev/null"))
        events.append(f"stop {name}")

    return [up("a"), up("b")]


def test_interleaved_rounds_drive_every_server_at_each_level_in_turn(
    calls: list[tuple[str, str]],
) -> None:
    events: list[str] = []
    between: list[int] = []
    rounds = run_servers(_args(True, 2), _ups(events), lambda: between.append(len(calls)))
    level_order = [("a", "1"), ("b", "1"), ("a", "32"), ("b", "32")]
    assert calls == level_order * 2
    assert between == [4]  # after the first round only, not after the last
    assert events == ["start a", "start b", "stop b", "stop a"]  # each started once
    assert [[lv["concurrency"] for lv in r] for r in rounds["a"]] == [[1, 32], [1, 32]]
    assert [lv["n"] for lv in rounds["b"][1]] == [6, 8]  # round 2 holds round 2's runs


def test_rounds_one_server_after_the_other(calls: list[tuple[str, str]]) -> None:
    events: list[str] = []
    rounds = run_servers(_args(False, 3), _ups(events))
    assert calls == [("a", "1,32")] * 3 + [("b", "1,32")] * 3
    assert events == ["start a", "stop a", "start b", "stop b"]
    assert len(rounds["a"]) == 3 and len(rounds["b"]) == 3


def test_the_contended_mode_pairs_each_level_alone_and_beside_the_hogs(
    calls: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--hogs N: at each level every server runs alone, then every server beside N hogs (the
    hogs started once per level, so the pair is minutes apart at most); the contended runs are
    kept under '<name> + N hogs'."""
    hogs: list[int] = []

    @contextlib.contextmanager
    def cpu_hogs(count: int) -> Iterator[list[int]]:
        hogs.append(count)
        calls.append(("hogs", str(count)))
        yield []

    monkeypatch.setattr(llm_compare, "cpu_hogs", cpu_hogs)
    rounds = run_servers(_args(True, 1, hogs=2), _ups([]))
    assert calls == [
        ("hogs", "0"), ("a", "1"), ("b", "1"), ("hogs", "2"), ("a", "1"), ("b", "1"),
        ("hogs", "0"), ("a", "32"), ("b", "32"), ("hogs", "2"), ("a", "32"), ("b", "32"),
    ]  # fmt: skip
    assert sorted(rounds) == ["a", "a + 2 hogs", "b", "b + 2 hogs"]
    assert [lv["n"] for lv in rounds["b + 2 hogs"][0]] == [6, 12]
