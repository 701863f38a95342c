"""`bench.test_share`: which test modules count as starting real servers, and the share."""

from __future__ import annotations

from pathlib import Path

from bench.test_share import SERVER_MARKERS, measure, starts_processes

# Spelled in parts, so that this module does not count itself as one that starts servers.
SERVER = "Lantern" + "Server"
WORKER = "Worker" + "Process"


def test_what_counts_as_starting_processes() -> None:
    assert starts_processes(f"with {SERVER}(root, store) as srv:")
    assert starts_processes('subprocess.run([sys.executable, "-m", "serve' + '.cli", "start"])')
    assert starts_processes(f"worker = {WORKER}(spec)")
    assert not starts_processes("from tests.support.server import build_archive, echo_archive")
    assert not starts_processes("async with in_process(config) as lantern:")
    assert not starts_processes(f"worker = {WORKER}(spec)", SERVER_MARKERS)


def test_the_share_counts_lines_of_test_modules_only(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "e2e").mkdir(parents=True)
    (tests / "e2e" / "test_real.py").write_text(f"{SERVER}\n" * 3)
    (tests / "test_fast.py").write_text("x = 1\n")
    (tests / "helpers.py").write_text(f"{SERVER}\n" * 50)  # not a test module
    share = measure(tests)
    assert (share.real_lines, share.total_lines) == (3, 4)
    assert share.real_files == [("tests/e2e/test_real.py", 3)]
    assert share.percent == 75.0
