"""What a start did, told to the user who ran ``serve start``; and the exit codes of ``serve``.

The server fills a `StartupReport` while it loads its startup models and keeps it in its record
(`serve.cli.server_record`); ``serve start`` reads it back and prints it with `report_lines`. Pure
functions, so that the exact lines are tested without processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Exit codes of `serve start` (and the other commands where they apply); docs/operating.md.
EXIT_OK = 0
EXIT_ERROR = 1  # the server exited during startup, was not healthy in time, or not running
EXIT_USAGE = 2  # a bad command line, config file or setting, or a model store that is missing
EXIT_ALREADY_RUNNING = 3  # the server record names a Lantern server that is running
EXIT_ADDRESS_IN_USE = 4  # an address could not be bound (in use, or not this machine's)
EXIT_MODELS_FAILED = 5  # the server runs, but at least one startup model did not load


@dataclass
class StartupReport:
    """The snapshot restored (if any), the models it brought back, the snapshot passed over for
    ``--models``, and every model that failed."""

    snapshot: str | None = None  # the snapshot file restored
    restored: list[str] = field(default_factory=list)  # "name version" of each restored model
    passed_over: str | None = None  # the newest snapshot, not restored: --models named the models
    failed: list[tuple[str, str]] = field(default_factory=list)  # (model, reason)
    # Store entries ``--models all`` did not take: (name, reason); and a line when it took none.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each: settings not honoured...

    def fail(self, model: str, reason: str) -> None:
        self.failed.append((model, " ".join(reason.split())))  # one line each

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> StartupReport:
        data = data or {}
        return cls(
            snapshot=data.get("snapshot"),
            restored=list(data.get("restored") or []),
            passed_over=data.get("passed_over"),
            failed=[(str(m), str(r)) for m, r in data.get("failed") or []],
            skipped=[(str(m), str(r)) for m, r in data.get("skipped") or []],
            notes=[str(n) for n in data.get("notes") or []],
        )


def report_lines(report: StartupReport) -> list[str]:
    """The lines ``serve start`` prints about the snapshot it restored or passed over, the store
    entries it skipped and the notes on what it loaded (none when there are none)."""
    lines = store_lines(report)
    if report.passed_over is not None:
        lines.append(
            f"Not restored: snapshot {report.passed_over}; --models names the models to load "
            "(a start without --models restores the newest snapshot)."
        )
    if report.snapshot is None:
        return lines
    brought = ", ".join(report.restored) if report.restored else "no models"
    lines.append(f"Restored snapshot {report.snapshot}: {brought}.")
    return lines


def store_lines(report: StartupReport) -> list[str]:
    """The store entries ``--models all`` skipped, with why, and the notes on what loaded."""
    lines = [f"Skipped {name} in the model store: {reason}" for name, reason in report.skipped]
    return lines + report.notes


def failure_lines(report: StartupReport) -> list[str]:
    """One line per model that failed to load: ``  model: reason``."""
    return [f"  {model}: {reason}" for model, reason in report.failed]
