"""Regenerate ``serve/grpc/gen/*_pb2.py`` from the vendored ``.proto`` files.

    python -m serve.grpc.generate          # rewrite the generated modules
    python -m serve.grpc.generate --check  # exit 1 if they differ from what would be generated

The generated modules are committed (see ``docs/grpc.md``, "Generated code"): installing Lantern
needs no ``protoc``, and the code a server runs is the code that was reviewed. They hold only
messages (``*_pb2.py``); the services are wired by hand in ``serve/grpc/services.py``, so nothing
ties the runtime to the ``grpcio`` version of the generator. Generated with ``grpcio-tools``
``GRPCIO_TOOLS_VERSION`` below; the modules then need ``protobuf`` at least the version they name.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.81.1"
HERE = Path(__file__).resolve().parent
PROTOS = HERE / "protos"
GEN = HERE / "gen"
FILES = (
    "inference.proto",
    "management.proto",
    "open_inference_grpc.proto",
    "model_config.proto",  # Triton's (BSD-3): config.pbtxt, and ModelConfig over gRPC
    "grpc_service.proto",  # Triton's (BSD-3): its extensions' messages (repository, statistics)
)


def generate(out: Path) -> None:
    """Run protoc (from grpcio-tools) over the vendored files into ``out``."""
    import google.rpc
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    googleapis = Path(next(iter(google.rpc.__path__))).parent.parent  # site-packages
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"-I{googleapis}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        *FILES,
    ]
    subprocess.run(cmd, check=True, cwd=PROTOS)
    for path in out.iterdir():  # protoc imports a sibling module by its bare name
        text = path.read_text()
        fixed = _SIBLING_IMPORT.sub(r"from serve.grpc.gen import \1 as", text)
        if fixed != text:
            path.write_text(fixed)


_SIBLING_IMPORT = re.compile(r"^import (\w+_pb2) as", re.MULTILINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    from importlib.metadata import version

    found = version("grpcio-tools")
    if found != GRPCIO_TOOLS_VERSION:
        print(f"warning: grpcio-tools {found}, generated with {GRPCIO_TOOLS_VERSION}")
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        names = sorted(p.name for p in Path(tmp).iterdir())
        if args.check:
            same = all(filecmp.cmp(Path(tmp) / n, GEN / n, shallow=False) for n in names)
            print("up to date" if same else "out of date: run python -m serve.grpc.generate")
            return 0 if same else 1
        for name in names:
            shutil.copyfile(Path(tmp) / name, GEN / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
