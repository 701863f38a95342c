"""``model-archiver`` / ``torch-model-archiver``: the command line of torch-model-archiver 0.12."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from archiver.build import ARCHIVE_FORMATS, build
from archiver.errors import ArchiveError
from archiver.manifest import RUNTIMES

_PROG_NAMES = ("model-archiver", "torch-model-archiver")


class _ArchiverCommand(click.Command):
    """Reports every failure as one ``<prog>: error: ...`` line, like argparse-based tools."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,  # ignored: failures always end the process
        **extra: Any,
    ) -> NoReturn:
        prog = _prog_name()
        try:
            result = super().main(
                args, prog_name or prog, complete_var, standalone_mode=False, **extra
            )
        except click.UsageError as exc:
            given = sys.argv[1:] if args is None else list(args)
            if not given and exc.ctx is not None:  # no arguments at all: show how to call it
                click.echo(exc.ctx.get_help(), err=True)
            _fail(prog, exc.format_message(), 2)
        except click.ClickException as exc:
            _fail(prog, exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail(prog, "aborted", 1)
        except ArchiveError as exc:
            _fail(prog, str(exc), 1)
        sys.exit(result if isinstance(result, int) else 0)


def _prog_name() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name in _PROG_NAMES else _PROG_NAMES[0]


def _fail(prog: str, message: str, code: int) -> NoReturn:
    click.echo(f"{prog}: error: {' '.join(message.split())}", err=True)
    sys.exit(code)


@click.command(cls=_ArchiverCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model-name", required=True, help="Model name; the output is <model-name>.mar.")
@click.option("-v", "--version", "version", required=True, help="Model version (modelVersion).")
@click.option("--serialized-file", help="Weights: .pt/.pth state_dict or TorchScript, .onnx, .so.")
@click.option("--model-file", help="Python file with the model class (eager mode).")
@click.option("--handler", required=True, help="Built-in handler name or file.py[:function].")
@click.option("--extra-files", help="Comma-separated files, folders (contents to root), globs.")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="python", show_default=True)
@click.option(
    "--export-path",
    type=click.Path(file_okay=False),
    default=".",
    help="Folder to write to (default: the current folder).",
)
@click.option(
    "--archive-format",
    type=click.Choice(ARCHIVE_FORMATS),
    default="default",
    show_default=True,
    help="default: .mar (deflated); zip-store: .mar (stored); tgz: .tar.gz; no-archive: folder.",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing output.")
@click.option("-r", "--requirements-file", help="requirements.txt with the model's dependencies.")
@click.option("-c", "--config-file", help="model-config.yaml (checked to be valid YAML).")
def main(
    model_name: str,
    version: str,
    serialized_file: str | None,
    model_file: str | None,
    handler: str,
    extra_files: str | None,
    runtime: str,
    export_path: str,
    archive_format: str,
    force: bool,
    requirements_file: str | None,
    config_file: str | None,
) -> None:
    """Package model files into a TorchServe-compatible model archive."""
    build(
        model_name=model_name,
        version=version,
        handler=handler,
        serialized_file=serialized_file,
        model_file=model_file,
        extra_files=extra_files or (),
        runtime=runtime,
        export_path=export_path,
        archive_format=archive_format,
        force=force,
        requirements_file=requirements_file,
        config_file=config_file,
    )
