"""``serve llm PATH``: archive a causal LM (a ``save_pretrained`` folder or a ``.gguf`` file) for
the ``text_generation`` handler and serve it, OpenAI's routes on (TorchServe's ``llm_launcher``).

It stays in the foreground, as ``serve start --foreground`` does; the archive is written to
``--model-store`` (``./model_store``) as ``NAME.mar`` and kept for later ``serve start`` runs.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from serve.cli import control, server_record
from serve.cli.control import CliError
from serve.cli.foreground import run_foreground
from serve.cli.startup_report import EXIT_USAGE
from serve.config import Config, ConfigError

if TYPE_CHECKING:
    from serve.server import Server

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


# A GGUF file's quantisation or precision at the end of its name (``.Q4_1``, ``-Q4_K_M``,
# ``.IQ3_XS``, ``-f16``, ``-fp16``, ``.bf16``): not part of the model's name.
_GGUF_TYPE = re.compile(r"[._-](?:I?Q\d+(?:_[A-Z0-9]+)*|F16|F32|FP16|FP32|BF16)$", re.IGNORECASE)


def default_name(path: Path) -> str:
    """A model name from the file or folder name, less a GGUF file's quantisation: letters,
    digits, ``_``, ``-`` and ``.``."""
    stem = path.name.removesuffix(".gguf")
    if path.name.endswith(".gguf"):
        stem = _GGUF_TYPE.sub("", stem)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "llm"


def archive_llm(path: Path, name: str, model_store: Path, *, force: bool = False) -> Path:
    """Write ``model_store/NAME.mar`` with the ``text_generation`` handler; its path. An archive
    already there is kept (`CliError`) unless ``force``, as ``model-archiver`` does."""
    from archiver import build

    files = model_files(path)
    existing = model_store / f"{name}.mar"
    if existing.exists() and not force:
        raise CliError(
            f"{existing} already exists: --force replaces it; to serve it as it is:\n"
            f"  serve start --model-store {model_store} --models {name}={name}.mar",
            EXIT_USAGE,
        )
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
@click.option("--force", is_flag=True, help="Replace an archive of that name in the store.")
def llm(
    path: Path,
    name: str | None,
    model_store: Path,
    pid_file: str | None,
    force: bool,
    **options: Any,
) -> None:
    """Archive PATH for the text_generation handler and serve it in the foreground."""
    name = name or default_name(path)
    written = archive_llm(path, name, model_store, force=force)
    click.echo(f"Wrote {written}; serving it as {name!r} (OpenAI API under /v1).")
    click.echo(
        "Loading it: a .gguf file is dequantised first, a minute or more on a small machine."
        if path.is_file()
        else "Loading it."
    )
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
    run_foreground(
        config, state_file, restore=False, on_started=lambda server: _tell_ready(server, name)
    )


def _tell_ready(server: Server, name: str) -> None:
    """Print what a user pastes next: the model's name, the base URL and the key."""
    failed = dict(server.startup.failed)
    if name in failed:
        click.echo(f"{name!r} did not load: {failed[name]}", err=True)
        return
    key_file = server.state.auth.key_file if server.state.auth is not None else None
    expires = server.config.token_expiration_min
    click.echo("\n".join(ready_lines(name, server.addresses["inference"], key_file, expires)))


def ready_lines(
    name: str, inference: str, key_file: Path | None, expires_min: float = 60
) -> list[str]:
    """The lines `serve llm` prints once its model is ready (pure, for the tests)."""
    base = f"{inference}/v1"
    lines = [f"Ready: model {name!r} at {base}", f"  export OPENAI_BASE_URL={base}"]
    if key_file is None:
        lines.append("  export OPENAI_API_KEY=none  # token auth is off: any key will do")
    else:
        read = f"import json; print(json.load(open('{key_file}'))['inference']['key'])"
        lines.append(f'  export OPENAI_API_KEY=$(python3 -c "{read}")')
        lines.append(
            f"  # the inference key of {key_file}: it expires in {expires_min:g} minutes "
            "(docs/llm.md); --disable-token-auth serves without one"
        )
    body = f'{{"model": "{name}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'
    lines.append(
        f'  curl {base}/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" '
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
    return lines
