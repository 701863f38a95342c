"""Token vocabularies for the text handlers, readable without torchtext or unpickling.

A vocabulary file is ``source_vocab.pt`` (``torch.save`` of a ``{token: index}`` dict or a
``[token, ...]`` list, or a dict holding ``"stoi"`` / ``"itos"``; read with
``weights_only=True``) or the same structures as JSON (``source_vocab.json`` / ``vocab.json``).
A pickled torchtext ``Vocab`` object, which TorchServe loads, is refused: convert it once with
``torch.save(vocab.get_stoi(), "source_vocab.pt")``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from handlers.exceptions import HandlerLoadError

VOCAB_FILES = ("source_vocab.pt", "source_vocab.json", "vocab.json")
UNK_TOKENS = ("<unk>", "<UNK>", "[UNK]")


class Vocab:
    """token -> index, with unknown tokens mapped to ``<unk>`` (or 0 when there is none)."""

    def __init__(self, stoi: Mapping[str, int]) -> None:
        self.stoi = {str(token): int(index) for token, index in stoi.items()}
        self.default_index = next((self.stoi[t] for t in UNK_TOKENS if t in self.stoi), 0)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.default_index)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __len__(self) -> int:
        return len(self.stoi)

    def get_stoi(self) -> dict[str, int]:
        return dict(self.stoi)


def vocab_from_object(obj: Any) -> Vocab:
    """Build a ``Vocab`` from a stoi dict, an itos list, or a dict with either under a key."""
    if isinstance(obj, Mapping) and ("stoi" in obj or "itos" in obj):
        obj = obj["stoi"] if "stoi" in obj else obj["itos"]
    if isinstance(obj, Mapping):
        return Vocab(obj)
    if isinstance(obj, (list, tuple)):
        return Vocab({str(token): i for i, token in enumerate(obj)})
    raise HandlerLoadError(f"unsupported vocabulary structure: {type(obj).__name__}")


def load_vocab(path: str) -> Vocab:
    """Read a vocabulary file (``.pt`` or ``.json``)."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            return vocab_from_object(json.load(f))
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise HandlerLoadError(
            f"{os.path.basename(path)} is not a token->index dict or token list readable with "
            f"weights_only=True (a pickled torchtext Vocab is not supported): {exc}"
        ) from exc
    return vocab_from_object(obj)


def find_vocab_file(model_dir: str, manifest: Mapping | None = None) -> str:
    """The manifest's legacy ``sourceVocab`` entry, else the first of ``VOCAB_FILES`` present."""
    legacy = ((manifest or {}).get("model") or {}).get("sourceVocab")
    candidates = ([legacy] if legacy else []) + list(VOCAB_FILES)
    for name in candidates:
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            return path
    raise HandlerLoadError(
        "Missing the source_vocab file: add source_vocab.pt or vocab.json as an extra file"
    )
