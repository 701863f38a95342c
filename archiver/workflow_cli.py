"""``workflow-archiver`` / ``torch-workflow-archiver``: the torch-workflow-archiver 0.2.15 CLI."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from archiver.cli import _fail
from archiver.errors import ArchiveError
from archiver.workflow import build_workflow

_PROG_NAMES = ("workflow-archiver", "torch-workflow-archiver")


class _WorkflowArchiverCommand(click.Command):
    """Reports every failure as one ``<prog>: error: ...`` line, like the argparse original."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,  # ignored: failures always end the process
        **extra: Any,
    ) -> NoReturn:
        name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        prog = name if name in _PROG_NAMES else _PROG_NAMES[0]
        try:
            result = super().main(
                args, prog_name or prog, complete_var, standalone_mode=False, **extra
            )
        except click.UsageError as exc:
            _fail(prog, exc.format_message(), 2)
        except click.ClickException as exc:
            _fail(prog, exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail(prog, "aborted", 1)
        except ArchiveError as exc:
            _fail(prog, str(exc), 1)
        sys.exit(result if isinstance(result, int) else 0)


@click.command(
    cls=_WorkflowArchiverCommand, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--workflow-name", required=True, help="Workflow name; the output is <name>.war.")
@click.option("--spec-file", required=True, help="The workflow's YAML spec (models and dag).")
@click.option("--handler", required=True, help="Python file with the workflow's function nodes.")
@click.option("--extra-files", help="Comma-separated files, folders (contents to root), globs.")
@click.option(
    "--export-path",
    type=click.Path(file_okay=False),
    default=".",
    help="Folder to write to (default: the current folder).",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing .war.")
def main(
    workflow_name: str,
    spec_file: str,
    handler: str,
    extra_files: str | None,
    export_path: str,
    force: bool,
) -> None:
    """Package a workflow spec and its handler into a TorchServe-compatible .war."""
    build_workflow(
        workflow_name=workflow_name,
        spec_file=spec_file,
        handler=handler,
        extra_files=extra_files or (),
        export_path=export_path,
        force=force,
    )
