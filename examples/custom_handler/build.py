"""Build two archives of the pretrained EfficientNet-Lite0 with custom handlers.

* ``top_class.mar``: the handler class in ``handler.py`` with ``model-config.yaml`` (batching,
  two workers, a handler option).
* ``top_class_fn.mar``: the function handler ``function_handler.py:classify``.

Both answer an image with its single most likely ImageNet class.

    python examples/custom_handler/build.py [--model-store DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for examples/_build.py
from _build import LABELS, archive, main, pretrained_efficientnet, trace

HERE = Path(__file__).resolve().parent


def build(model_store: Path) -> list[Path]:
    """Write both archives into ``model_store`` and return their paths."""
    model_store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = str(trace(pretrained_efficientnet(), Path(tmp) / "efficientnet_lite0.pt"))
        class_style = archive(
            model_store,
            model_name="top_class",
            handler=str(HERE / "handler.py"),
            serialized_file=weights,
            extra_files=[str(LABELS)],
            config_file=str(HERE / "model-config.yaml"),
        )
        function_style = archive(
            model_store,
            model_name="top_class_fn",
            handler=f"{HERE / 'function_handler.py'}:classify",
            serialized_file=weights,
            extra_files=[str(LABELS)],
        )
    return [class_style, function_style]


if __name__ == "__main__":
    main(build, __doc__.splitlines()[0])
