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

import sys
import tempfile
from pathlib import Path

from archiver.workflow import build_workflow

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, archive, export_onnx, main, pretrained_efficientnet, trace

HERE = Path(__file__).resolve().parent


def build(model_store: Path) -> list[Path]:
    """Write the two model archives and the workflow archive; return their paths."""
    model_store.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        model = pretrained_efficientnet()
        files = (
            trace(model, Path(tmp) / "efficientnet_lite0.pt"),
            export_onnx(model, Path(tmp) / "efficientnet_lite0.onnx"),
        )
        for name, weights in zip(("classifier_ts", "classifier_onnx"), files, strict=True):
            written.append(
                archive(
                    model_store,
                    model_name=name,
                    handler="image_classifier",
                    serialized_file=str(weights),
                    extra_files=[str(LABELS)],
                    config_file=str(HERE / "model-config.yaml"),
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


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
