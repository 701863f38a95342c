"""Class-index -> label mappings (``index_to_name.json``), as ``ts.utils.util`` handles them."""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

LABEL_FILE = "index_to_name.json"


def load_label_mapping(mapping_file_path: str | os.PathLike) -> dict[str, str] | None:
    """Read a label file in any of TorchServe's three formats; None if there is no file.

    ``{"0": "tench"}``, ImageNet style ``{"0": ["n01440764", "tench"]}`` (last element wins), or
    ``{"object_type_names": ["person", ...]}``. Keys come back as strings.
    """
    if not os.path.isfile(mapping_file_path):
        logger.warning(
            "%r is missing. Inference output will not include class name.", str(mapping_file_path)
        )
        return None
    with open(mapping_file_path, encoding="utf-8") as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise ValueError('index->name JSON mapping should be in "class": "label" format.')
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(i): str(name) for i, name in enumerate(names)}
    result = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ValueError("labels in index->name mapping must be either str or List[str]")
        result[str(key)] = label
    return result


def map_class_to_label(
    probs: list[list[Any]],
    mapping: dict[str, str] | None = None,
    lbl_classes: Iterable[Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """Per row, ``{label: prob}``; labels from ``mapping``, else the class index as a string.

    A class missing from the mapping raises KeyError, as TorchServe's does (a request then
    answers 500): a label file numbered from 1 for a model whose classes start at 0 is an error
    to see, not a label ``"0"`` to guess. Empty ``probs`` give ``[]`` (TorchServe: IndexError).
    """
    if not isinstance(probs, list):
        raise TypeError("Convert classes to list before doing mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise TypeError("Mapping must be a dict")
    if lbl_classes is None:
        width = len(probs[0]) if probs else 0
        lbl_classes = itertools.repeat(range(width), len(probs))

    def label(cls: Any) -> str:
        key = str(cls)
        if mapping is None:
            return key
        if key not in mapping:
            raise KeyError(f"class {key} has no label in {LABEL_FILE}")
        return mapping[key]

    return [
        {label(cls): prob for cls, prob in zip(classes, row, strict=False)}
        for classes, row in zip(lbl_classes, probs, strict=False)
    ]
