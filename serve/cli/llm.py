"""``serve llm PATH``: archive a causal LM (a ``save_pretrained`` folder or a ``.gguf`` file) for
the ``text_generation`` handler and serve it, OpenAI's routes on (TorchServe's ``llm_launcher``).

It stays in the foreground, as ``serve start --foreground`` does; the archive is written to
``--model-store`` (``./model_store``) as ``NAME.mar`` and kept for later ``serve start`` runs.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import click

from serve.cli import control, server_record
from serve.cli.control import CliError
from serve.cli.foreground import run_foreground
from serve.cli.startup_report import EXIT_USAGE
from serve.config import Config, ConfigError

# model-config.yaml of the archive: one worker, the engine's defaults (docs/generation.md); a
# .gguf file is dequantised on every start, which takes minutes on a small, busy machine.
MODEL_CONFIG = (
    "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 32\nmaxBatchDelay: 0\nstartupTimeout: 600\n"
)


def model_files(path: Path) -> list[Path]:
    """The files to archive: the ``.gguf`` file, or the folder's files (with ``config.json``)."""
    if path.is_file():
        if path.suffix != ".gguf":
            raise CliError(f"{path} is not a .gguf file or a model folder.", EXIT_USAGE)
        return [path]
    if not path.is_dir():
        raise CliError(f"{path} does not exist.", EXIT_USAGE)
    if not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        raise CliError(f"{path} holds no config.json or .gguf file.", EXIT_USAGE)
    return sorted(p for p in path.iterdir() if p.is_file())


def default_name(path: Path) -> str:
    """A model name from the file or folder name: letters, digits, ``_``, ``-`` and ``.``."""
    stem = path.name.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "llm"


def archive_llm(path: Path, name: str, model_store: Path) -> Path:
    """Write ``model_store/NAME.mar`` with the ``text_generation`` handler; its path."""
    from archiver import build

    files = model_files(path)
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / "model-config.yaml"
        config_file.write_text(MODEL_CONFIG)
        return Path(
            build(
                model_name=name,
                version="1.0",
                handler="text_generation",
                extra_files=[str(f) for f in files],
                config_file=str(config_file),
                export_path=str(model_store),
                force=True,
            )
        )


def _model_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--name``, checked as the archiver checks it: a usage error, not a traceback."""
    from archiver import ManifestError
    from archiver.manifest import validate_model_name

    if value is not None:
        try:
            validate_model_name(value)
        except ManifestError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command(short_help="Archive an LLM (folder or .gguf) and serve it with OpenAI's API.")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", default=None, callback=_model_name, help="Model name (default: from PATH).")
@click.option(
    "--model-store",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("model_store"),
    show_default=True,
    help="Where the archive is written.",
)
@click.option("--inference-address", default=None, help="e.g. http://127.0.0.1:8080")
@click.option("--management-address", default=None, help="e.g. http://127.0.0.1:8081")
@click.option("--metrics-address", default=None, help="e.g. http://127.0.0.1:8082")
@click.option("--disable-token-auth", is_flag=True, help="Serve without token authorization.")
@click.option("--pid-file", default=None, help="The server record (default: the usual one).")
def llm(
    path: Path, name: str | None, model_store: Path, pid_file: str | None, **options: Any
) -> None:
    """Archive PATH for the text_generation handler and serve it in the foreground."""
    name = name or default_name(path)
    written = archive_llm(path, name, model_store)
    click.echo(f"Wrote {written}; serving it as {name!r} (OpenAI API under /v1).")
    overrides: dict[str, Any] = {
        "model_store": str(model_store),
        "load_models": [f"{name}={written.name}"],
        "snapshot": False,
        "enable_openai_api": True,
        "disable_token_authorization": options.pop("disable_token_auth") or None,
        **{k: v for k, v in options.items() if v is not None},
    }
    try:
        config = Config.load(overrides={k: v for k, v in overrides.items() if v is not None})
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    state_file = server_record.record_path(pid_file)
    control.refuse_if_running(state_file)
    run_foreground(config, state_file, restore=False)
