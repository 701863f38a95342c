"""Gather the files that go into an archive, with the names they get there."""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from archiver.errors import ArchiveError
from archiver.manifest import BUILTIN_HANDLERS, BUILTIN_LSP_HANDLERS, MANIFEST_DIR

SKIP_DIRS = frozenset({"__pycache__", "__MACOSX"})
SKIP_SUFFIXES = (".pyc", ".DS_Store", ".mar")
_GLOB_CHARS = frozenset("*?[")


class Entry(NamedTuple):
    """One file to pack: its name inside the archive (POSIX form) and where to read it."""

    arcname: str
    path: Path


def skip_dir(name: str) -> bool:
    """Folders torch-model-archiver leaves out: __pycache__, __MACOSX and dot-folders."""
    return name in SKIP_DIRS or name.startswith(".")


def skip_file(name: str) -> bool:
    """Files left out of folders and globs: dot-files, *.pyc, .DS_Store, *.mar."""
    return name.startswith(".") or name.endswith(SKIP_SUFFIXES)


def handler_file(handler: str, runtime: str) -> Path | None:
    """The file a ``--handler`` value refers to, or None for a built-in handler."""
    if runtime == "LSP":
        if handler in BUILTIN_LSP_HANDLERS:
            return None
        library = handler.split(":", 1)[0]
        suffix = ".dylib" if sys.platform == "darwin" else ".so"
        return Path(library if library.endswith(suffix) else library + suffix)
    if handler in BUILTIN_HANDLERS:
        return None
    module = handler.split(":", 1)[0]  # "my_handler.py:fn" names a function in my_handler.py
    return Path(module if module.endswith(".py") else module + ".py")


def collect(
    *,
    handler: str,
    runtime: str,
    serialized_file: str | None,
    model_file: str | None,
    extra_files: Sequence[str],
    requirements_file: str | None,
    config_file: str | None,
    exclude: Iterable[Path] = (),
) -> list[Entry]:
    """All files for the archive root, in torch-model-archiver's copy order.

    As there, a later file with the same archive name replaces an earlier one. ``exclude`` lists
    resolved paths never to pack (the output being written, when it sits in an extra folder).
    """
    excluded = {Path(p) for p in exclude}
    entries: dict[str, Path] = {}

    def add_single(label: str, value: str | Path | None) -> None:
        if value is None or value == "":
            return
        path = Path(value)
        if not path.is_file():
            raise ArchiveError(f"{label} not found: {path}")
        entries[path.name] = path

    add_single("model file", model_file)
    add_single("serialized file", serialized_file)
    handler_path = handler_file(handler, runtime)
    if handler_path is not None and not handler_path.is_file():
        builtins = ", ".join(sorted(BUILTIN_LSP_HANDLERS if runtime == "LSP" else BUILTIN_HANDLERS))
        raise ArchiveError(
            f"handler file not found: {handler_path} (or use a built-in handler: {builtins})"
        )
    add_single("handler file", handler_path)
    for entry in _extra_entries(extra_files, excluded):
        entries[entry.arcname] = entry.path
    add_single("requirements file", requirements_file)
    add_single("config file", config_file)
    return [Entry(name, path) for name, path in entries.items()]


def split_extra_files(extra_files: str | Sequence[str]) -> list[str]:
    """``--extra-files`` is one comma-separated string; accept that or a list of paths."""
    items = extra_files.split(",") if isinstance(extra_files, str) else extra_files
    return [item.strip() for item in items if item.strip()]


def extra_entries(extra_files: str | Sequence[str], exclude: Iterable[Path] = ()) -> list[Entry]:
    """The entries for an ``--extra-files`` value (files, folders, globs), in packing order."""
    return list(_extra_entries(split_extra_files(extra_files), {Path(p) for p in exclude}))


def _extra_entries(extra_files: Sequence[str], excluded: set[Path]) -> Iterator[Entry]:
    for spec in split_extra_files(extra_files):
        if _GLOB_CHARS.intersection(spec):
            matches = sorted(glob.glob(spec))
            if not matches:
                raise ArchiveError(f"extra files pattern matches nothing: {spec}")
            for match in matches:
                path = Path(match)
                if skip_dir(path.name) if path.is_dir() else skip_file(path.name):
                    continue
                yield from _expand(path, excluded)
        else:
            path = Path(spec)
            if not path.exists():
                raise ArchiveError(f"extra file not found: {spec}")
            yield from _expand(path, excluded)


def _expand(path: Path, excluded: set[Path]) -> Iterator[Entry]:
    """A file keeps its base name; a folder's contents land in the root with their sub-paths."""
    if path.resolve() in excluded:
        return
    if path.is_file():
        yield Entry(path.name, path)
        return
    if not path.is_dir():
        raise ArchiveError(f"extra file is neither a file nor a folder: {path}")
    for current, dirs, files in os.walk(path):
        here = Path(current)
        dirs[:] = sorted(
            d for d in dirs if not skip_dir(d) and (here / d).resolve() not in excluded
        )
        if here == path:
            # Our own MANIFEST is written last; never let a stale MAR-INF shadow it.
            dirs[:] = [d for d in dirs if d != MANIFEST_DIR]
        for name in sorted(files):
            file = here / name
            if skip_file(name) or file.resolve() in excluded or not file.is_file():
                continue
            yield Entry(file.relative_to(path).as_posix(), file)
