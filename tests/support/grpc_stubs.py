"""Python stubs generated from TorchServe 0.12's own ``.proto`` files, as its users make them.

``python -m grpc_tools.protoc --python_out --grpc_python_out`` over ``serve/grpc/protos`` (the
files vendored from pytorch/serve v0.12.0) into a temporary folder, then imported by the names
TorchServe's ``ts_scripts/torchserve_grpc_client.py`` uses (``inference_pb2``, ...).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.support.server import REPO

PROTOS = REPO / "serve" / "grpc" / "protos"


def generate(out: Path) -> SimpleNamespace:
    """Generate and import the stubs; returns the modules by their generated names."""
    import google.rpc
    import grpc_tools

    out.mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    googleapis = Path(next(iter(google.rpc.__path__))).parent.parent
    files = ["inference.proto", "management.proto", "open_inference_grpc.proto"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"-I{googleapis}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *files,
        ],
        check=True,
    )
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    names = [
        f"{stem}{suffix}" for stem in (f[:-6] for f in files) for suffix in ("_pb2", "_pb2_grpc")
    ]
    return SimpleNamespace(**{name: importlib.import_module(name) for name in names})


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    """The metadata TorchServe's client sends with ``--auth-token``."""
    return (("protocol", "gRPC"), ("session_id", "12345"), ("authorization", f"Bearer {key}"))


STUBS_PACKAGE = "tfserving_stubs"


def generate_tf_serving(out: Path) -> SimpleNamespace:
    """Stubs from the vendored TF Serving and TensorFlow ``.proto`` files, as a TF Serving
    user generates them, imported under ``tfserving_stubs``: under their own names,
    ``tensorflow.core`` would import TensorFlow itself when it is installed (the ``tensorflow``
    extra), and its messages clash with these in protobuf's pool."""
    import grpc_tools

    from serve.grpc.generate import rehome, tree_files

    package = out / STUBS_PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    include = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={package}",
            f"--grpc_python_out={package}",
            *tree_files(),
        ],
        check=True,
        cwd=PROTOS,
    )
    rehome(package, STUBS_PACKAGE)  # the *_pb2_grpc modules' imports too
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    apis = [
        "classification_pb2",
        "get_model_metadata_pb2",
        "get_model_status_pb2",
        "inference_pb2",
        "input_pb2",
        "model_management_pb2",
        "predict_pb2",
        "regression_pb2",
        "prediction_service_pb2_grpc",
        "model_service_pb2_grpc",
    ]
    root = STUBS_PACKAGE
    modules = {
        name: importlib.import_module(f"{root}.tensorflow_serving.apis.{name}") for name in apis
    }
    modules["tensor_pb2"] = importlib.import_module(f"{root}.tensorflow.core.framework.tensor_pb2")
    modules["types_pb2"] = importlib.import_module(f"{root}.tensorflow.core.framework.types_pb2")
    modules["example_pb2"] = importlib.import_module(f"{root}.tensorflow.core.example.example_pb2")
    modules["model_server_config_pb2"] = importlib.import_module(
        f"{root}.tensorflow_serving.config.model_server_config_pb2"
    )
    return SimpleNamespace(**modules)
