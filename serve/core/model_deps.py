"""Per-model Python dependencies: ``install_py_dep_per_model`` (off by default, as in TorchServe).

When it is on and an archive's manifest names a ``requirementsFile``, registration installs that
file into a folder of the model's own before any worker starts, and the model's workers put the
folder first on ``sys.path``. The server's own environment is never changed:

* the folder is a virtual environment made ``--without-pip`` with the server's interpreter, whose
  ``site-packages`` holds a ``.pth`` naming the server's own ``sys.path``, so pip (run as
  ``pip --python <venv>``) sees what the server already has and installs only what is missing or
  of another version (``pip --target`` would reinstall everything, torch included);
* pip runs as a subprocess awaited on the event loop (never blocking it), with its cwd in the
  model folder (as TorchServe's, so relative paths in ``requirements.txt`` resolve there); its
  output goes line by line to the model log;
* a failure answers the registration with 400 and pip's last lines; nothing is left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import sysconfig
import venv
from collections import deque
from pathlib import Path
from typing import Any

from serve.wire.errors import BadRequest

logger = logging.getLogger("serve.worker")  # the model log
INSTALL_TIMEOUT = 1800.0  # seconds; a large requirements file can take long, but not forever


def requirements_file(model_dir: Path, manifest: dict[str, Any]) -> Path | None:
    """The archive's requirements file, if its manifest names one that exists."""
    name = ((manifest or {}).get("model") or {}).get("requirementsFile")
    if not name:
        return None
    path = (model_dir / name).resolve()
    if not path.is_relative_to(model_dir.resolve()) or not path.is_file():
        raise BadRequest(f"The manifest's requirementsFile {name!r} is not in the archive.")
    return path


def site_packages(env_dir: Path) -> Path:
    """The ``site-packages`` folder of the environment at ``env_dir``."""
    paths = sysconfig.get_paths(vars={"base": str(env_dir), "platbase": str(env_dir)})
    return Path(paths["purelib"])


def _make_environment(env_dir: Path) -> Path:
    """A pip-less venv that sees the server's packages; returns its site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)
    target = site_packages(env_dir)
    target.mkdir(parents=True, exist_ok=True)
    server_paths = [p for p in sys.path if p and Path(p).is_dir()]
    (target / "_lantern_server.pth").write_text("\n".join(server_paths) + "\n")
    return target


def _env_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


async def install_requirements(
    model_name: str, model_dir: Path, requirements: Path, env_dir: Path
) -> Path:
    """Install ``requirements`` for one model; returns the folder to put on its ``sys.path``.

    Raises `BadRequest` (with pip's last lines) when the installation fails; ``env_dir`` is then
    removed.
    """
    try:
        packages = await asyncio.to_thread(_make_environment, env_dir)
        command = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(_env_python(env_dir)),
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "-r",
            str(requirements),
        ]
        logger.info("[%s] Installing the model's dependencies: %s", model_name, " ".join(command))
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=str(model_dir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        tail: deque[str] = deque(maxlen=8)
        try:
            code = await asyncio.wait_for(_relay(proc, model_name, tail), INSTALL_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BadRequest(
                f"Installing the dependencies of model {model_name} took longer than "
                f"{INSTALL_TIMEOUT:.0f} s."
            ) from None
        if code != 0:
            detail = " | ".join(tail)
            raise BadRequest(
                f"Failed to install the dependencies of model {model_name} from "
                f"{requirements.name} (pip exit code {code}): {detail}"
            )
        logger.info("[%s] Dependencies installed in %s", model_name, packages)
        return packages
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, env_dir, True)
        raise


async def _relay(proc: asyncio.subprocess.Process, model_name: str, tail: deque[str]) -> int:
    assert proc.stdout is not None
    async for raw in proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            tail.append(line)
            logger.info("[%s] pip: %s", model_name, line)
    return await proc.wait()
