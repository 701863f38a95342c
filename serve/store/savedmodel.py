"""TensorFlow SavedModels in the model store: a layout for the one model loader.

A SavedModel is a folder holding ``saved_model.pb`` (and ``variables/``). TF Serving's tree is
``<name>/<version>/`` of such folders; a SavedModel folder given alone is version 1 (or its own
name, when that is a number). Each version is served as an *implicit archive* whose
``serializedFile`` is the SavedModel folder (linked, never copied), loaded by the built-in handler
with TensorFlow in the worker (``handlers/savedmodel.py``; the ``lantern-serve[tensorflow]``
extra). Plugged into ``serve.store.layouts`` with `add_recogniser` when this module is imported.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from archiver import ModelArchive
from serve.store.layouts import ModelLayout, Version, add_recogniser

MARKERS = ("saved_model.pb", "saved_model.pbtxt")
PLATFORM = "tensorflow_savedmodel"
LINK = "saved_model"


def is_saved_model(folder: Path) -> bool:
    return folder.is_dir() and any((folder / m).is_file() for m in MARKERS)


def recognise_saved_model(path: Path) -> ModelLayout | None:
    """A SavedModel folder, or a folder of numbered SavedModel versions; None otherwise."""
    if not path.is_dir():
        return None
    if is_saved_model(path):
        version = path.name if path.name.isdigit() else "1"
        name = path.parent.name if path.name.isdigit() else path.name
        versions = {version: Version(path)}
    else:
        name = path.name
        versions = {
            child.name: Version(child)
            for child in sorted(path.iterdir())
            if child.name.isdigit() and is_saved_model(child)
        }
        if not versions:
            return None
    layout = ModelLayout(name, "versioned", path, versions, opener=open_saved_model)
    layout.model_config.setdefault("metadata", {})["platform"] = PLATFORM
    return layout


def open_saved_model(layout: ModelLayout, version: str, dest: Path) -> ModelArchive:
    """``dest`` with a link to the version's SavedModel and a manifest for the built-in handler."""
    source = layout.versions[version].path
    dest.mkdir(parents=True, exist_ok=False)
    try:
        os.symlink(source.resolve(), dest / LINK, target_is_directory=True)
        manifest = {
            "runtime": "python",
            "model": {
                "modelName": layout.name,
                "serializedFile": LINK,
                "handler": "base_handler",
                "modelVersion": version,
            },
        }
        return ModelArchive(dest.resolve(), manifest, dict(layout.model_config))
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


add_recogniser(recognise_saved_model, first=True)
