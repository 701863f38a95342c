"""The watched model store: files in, versions served; files out, versions unloaded.

Two layouts, side by side in one store:

- flat, TorchServe's: ``<store>/<file>.mar`` (also ``.tar.gz``, ``.tgz`` or an unpacked archive
  folder holding ``MAR-INF/MANIFEST.json``); the model's name and version are its manifest's.
- versioned, TF Serving's, Triton's and OVMS's: ``<store>/<name>/<version>/`` holding one archive
  file, an unpacked archive or a model file (`serve.store.layouts`); the folder names are the
  model's name and version, and ``<name>/config.pbtxt`` is read when there is one.

Completeness rule: a file or folder is taken only once its fingerprint (the number, sizes and
modification times of its files) has stayed the same for at least one ``watch_interval``, across
two or more scans (`Stability`).
Names starting with ``.`` or ending in ``.tmp``, ``.part``, ``.partial``, ``.crdownload`` or ``~``
are never taken, so a writer that renames a finished file into place is taken at the next stable
scan too.

Change notifications come from ``watchfiles`` where the filesystem gives them (a scan runs at
once); a scan also runs every ``watch_interval`` regardless, the polling fallback that network
filesystems and Kubernetes volumes need. What to serve is
`serve.store.version_policy.plan_versions`; every step goes through the registry (register,
`Registry.swap_default`, unregister), the same swap the management API uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archiver import ArchiveError, read_manifest
from serve.store.layouts import version_of
from serve.store.version_policy import (
    DEFAULT_POLICY,
    PolicyError,
    VersionPlan,
    VersionPolicy,
    parse_policy,
    plan_versions,
    sort_versions,
)
from serve.wire.errors import Conflict, ServeError

if TYPE_CHECKING:
    from serve.core.registry import Registry

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz")
_PARTIAL_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", "~")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")
MANIFEST = Path("MAR-INF") / "MANIFEST.json"

Fingerprint = tuple[int, int, int]  # files, bytes, newest mtime (ns)


@dataclass(frozen=True)
class Candidate:
    """One model version the store holds."""

    name: str
    version: str
    path: Path  # the archive file or unpacked folder to register
    url: str  # ``path`` relative to the store: what the registry resolves
    fingerprint: Fingerprint


# ----- scanning (blocking: run in a thread) ------------------------------------------------------


def scan_store(store: Path, manifests: dict[Path, tuple[Fingerprint, str, str]]) -> list[Candidate]:
    """Every model version in ``store``, both layouts. ``manifests`` caches what flat archives'
    manifests say, by fingerprint (an archive still being written is skipped this time)."""
    found: list[Candidate] = []
    if not store.is_dir():
        return found
    for entry in sorted(store.iterdir()):
        if _ignored(entry.name):
            continue
        if _is_archive(entry):
            flat = _flat(store, entry, manifests)
            if flat is not None:
                found.append(flat)
        elif entry.is_dir() and _NAME.fullmatch(entry.name):
            for version_dir in sorted(entry.iterdir()):
                if _ignored(version_dir.name) or not version_dir.is_dir():
                    continue
                if not _NAME.fullmatch(version_dir.name) or version_dir.name == "all":
                    continue
                target = _version_target(version_dir)
                url = None if target is None else target.relative_to(store).as_posix()
                if target is None and version_of(version_dir) is not None:
                    # A model file (Triton, OVMS): the model folder is what the registry opens,
                    # so that its config.pbtxt is read; the version picks the folder.
                    target, url = version_dir, entry.name
                if target is not None and url is not None:
                    found.append(
                        Candidate(
                            entry.name,
                            version_dir.name,
                            target,
                            url,
                            fingerprint(version_dir),
                        )
                    )
    return found


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.endswith(_PARTIAL_SUFFIXES)


def _is_archive(path: Path) -> bool:
    if path.is_file():
        return path.name.endswith(ARCHIVE_SUFFIXES)
    return path.is_dir() and (path / MANIFEST).is_file()


def _flat(
    store: Path, path: Path, manifests: dict[Path, tuple[Fingerprint, str, str]]
) -> Candidate | None:
    print_ = fingerprint(path)
    cached = manifests.get(path)
    if cached is not None and cached[0] == print_:
        name, version = cached[1], cached[2]
    else:
        try:
            model = read_manifest(path).get("model", {})
        except (ArchiveError, OSError, ValueError):
            return None  # not complete yet, or no archive: looked at again next scan
        name, version = str(model.get("modelName", "")), str(model.get("modelVersion") or "1.0")
        if not _NAME.fullmatch(name) or not _NAME.fullmatch(version):
            return None
        manifests[path] = (print_, name, version)
    return Candidate(name, version, path, path.relative_to(store).as_posix(), print_)


def _version_target(folder: Path) -> Path | None:
    """What a versioned folder holds: itself (unpacked) or its one archive file."""
    if (folder / MANIFEST).is_file():
        return folder
    archives = [p for p in folder.iterdir() if not _ignored(p.name) and _is_archive(p)]
    return archives[0] if len(archives) == 1 else None


def fingerprint(path: Path) -> Fingerprint:
    """(files, bytes, newest mtime) of a file or of everything under a folder."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    count = size = newest = 0
    for item in files:
        try:
            st = item.stat()
        except OSError:
            continue
        count += 1
        size += st.st_size
        newest = max(newest, st.st_mtime_ns)
    return count, size, newest


class Stability:
    """The completeness rule: a candidate counts once scans have seen the same files for at
    least ``min_age`` seconds (two scans in a row, one interval apart; an early scan woken by a
    change notification does not shorten that)."""

    def __init__(self, min_age: float) -> None:
        self.min_age = min_age
        self._since: dict[tuple[str, str, Path], tuple[Fingerprint, float]] = {}

    def complete(self, candidates: Iterable[Candidate], now: float) -> list[Candidate]:
        since: dict[tuple[str, str, Path], tuple[Fingerprint, float]] = {}
        stable = []
        for cand in candidates:
            key = (cand.name, cand.version, cand.path)
            print_, first_seen = self._since.get(key, (None, now))
            if print_ != cand.fingerprint:
                first_seen = now  # new, or changed since the last scan: the clock restarts
            since[key] = (cand.fingerprint, first_seen)
            if print_ == cand.fingerprint and now - first_seen >= self.min_age:
                stable.append(cand)
        self._since = since
        return stable


# ----- the watcher -------------------------------------------------------------------------------


class StoreWatcher:
    """Keeps the registry's versions in line with the model store and the version policies."""

    def __init__(self, registry: Registry, store: Path, interval: float) -> None:
        self.registry = registry
        self.store = store.resolve()
        self.interval = max(interval, 0.05)
        self.stability = Stability(self.interval * 0.9)  # timers may wake a little early
        self._manifests: dict[Path, tuple[Fingerprint, str, str]] = {}
        # name -> version -> the candidate it was loaded from (only versions the watcher owns)
        self.owned: dict[str, dict[str, Candidate]] = {}
        # name -> version -> fingerprint that failed: retried only when the files change
        self.failed: dict[str, dict[str, Fingerprint]] = {}
        self._warned: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()

    async def run(self) -> None:
        """Scan, reconcile, wait for a change or the interval; until `stop`."""
        notifier = asyncio.create_task(self._notifications())
        logger.info("Watching model store %s every %g s", self.store, self.interval)
        try:
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    await self.scan_once()
                except Exception:  # a bad scan must not end the watching
                    logger.exception("Model store scan failed")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
        finally:
            notifier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await notifier

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def _notifications(self) -> None:
        """Wake the scan loop on filesystem events, where watchfiles gets them."""
        try:
            from watchfiles import awatch
        except ImportError:
            logger.info("watchfiles is not installed: polling %s only", self.store)
            return
        try:
            async for _ in awatch(self.store, stop_event=self._stop, debounce=200, step=20):
                self._wake.set()
        except Exception as exc:  # e.g. out of inotify watches: polling still runs
            logger.warning("No change notifications for %s (%s): polling only", self.store, exc)

    async def scan_once(self) -> None:
        candidates = await asyncio.to_thread(scan_store, self.store, self._manifests)
        complete = self.stability.complete(candidates, time.monotonic())
        by_name: dict[str, dict[str, Candidate]] = {}
        for cand in complete:
            by_name.setdefault(cand.name, {})
            first = by_name[cand.name].get(cand.version)
            if first is not None:
                if (cand.url, first.url) not in self._warned:
                    self._warned.add((cand.url, first.url))
                    logger.warning(
                        "Model %s version %s is in the store twice (%s, %s); using %s",
                        cand.name,
                        cand.version,
                        first.url,
                        cand.url,
                        first.url,
                    )
                continue
            by_name[cand.name][cand.version] = cand
        # A served version whose files are still there but changing (rewritten in place) stays
        # until they settle: only files that are gone, or now hold another version, unload it.
        settled_paths = {c.path for c in complete}
        for name, versions in self.owned.items():
            for version, cand in versions.items():
                if version in by_name.get(name, {}) or cand.path in settled_paths:
                    continue
                if cand.path.exists():
                    by_name.setdefault(name, {})[version] = cand
        for name in sorted(set(by_name) | set(self.owned)):
            try:
                await self.reconcile(name, by_name.get(name, {}))
            except Exception:
                logger.exception("Updating model %s from the store failed", name)

    def policy(self, name: str) -> VersionPolicy:
        """The server config's policy for ``name``, else the newest loaded version's
        ``versionPolicy`` from its model-config.yaml, else the server's ``version_policy``."""
        config = self.registry.config
        per_model = config.model_version_policies
        if isinstance(per_model, str):
            try:
                per_model = json.loads(per_model) if per_model.strip() else {}
            except json.JSONDecodeError:
                logger.error("model_version_policies is not JSON: %r", per_model)
                per_model = {}
        choices: list[Any] = [per_model.get(name)] if isinstance(per_model, dict) else []
        entry = self.registry.models.get(name)
        if entry is not None and entry.versions:
            newest = entry.versions[sort_versions(entry.versions)[-1]]
            choices.append(newest.source.model_config.get("versionPolicy"))
        choices.append(config.version_policy)
        for choice in choices:
            if choice in (None, ""):
                continue
            try:
                return parse_policy(choice)
            except PolicyError as exc:
                logger.error("Model %s: ignoring version policy %r: %s", name, choice, exc)
        return DEFAULT_POLICY

    def plan(self, name: str, available: dict[str, Candidate]) -> VersionPlan:
        entry = self.registry.models.get(name)
        owned = self.owned.setdefault(name, {})
        for version in list(owned):  # unregistered by someone else: no longer ours
            if entry is None or version not in entry.versions:
                del owned[version]
        failed = self.failed.setdefault(name, {})
        for version, print_ in list(failed.items()):  # changed files get another chance
            if version not in available or available[version].fingerprint != print_:
                del failed[version]
        ready = [v for v in owned if entry is not None and entry.versions[v].ready_workers() > 0]
        default = entry.default_version if entry is not None else None
        return plan_versions(self.policy(name), available, owned, ready, failed, default)

    async def reconcile(self, name: str, available: dict[str, Candidate]) -> None:
        """Load, swap and unload until the plan for ``name`` is done (at most a few rounds)."""
        last: VersionPlan | None = None
        for _ in range(4):
            plan = self.plan(name, available)
            if plan == VersionPlan() or plan == last:
                return
            last = plan
            for version in plan.load:
                await self._load(available[version])
            if plan.default is not None:
                try:
                    await self.registry.swap_default(name, plan.default)
                except ServeError as exc:
                    self._fail(available.get(plan.default), exc.message)
            for version in plan.unload:
                await self._unload(name, version)

    def settings_for(self, cand: Candidate) -> dict[str, Any] | None:
        """Settings over the version's own model-config.yaml (none here; see ConfigWatcher)."""
        return None

    async def _load(self, cand: Candidate) -> None:
        logger.info("Model store: loading %s version %s from %s", cand.name, cand.version, cand.url)
        try:
            await self.registry.register(
                cand.url,
                model_name=cand.name,
                version=cand.version,
                synchronous=True,
                settings=self.settings_for(cand),
            )
        except Conflict:
            logger.info(
                "Model %s version %s is registered already: watching it", cand.name, cand.version
            )
        except ServeError as exc:
            self._fail(cand, exc.message)
            failures = self.registry.failures.get(cand.name, {})
            if cand.version not in failures:  # refused before the registry knew its name
                self.registry.record_failure(cand.name, cand.version, exc.message)
            return
        self.owned.setdefault(cand.name, {})[cand.version] = cand

    def _fail(self, cand: Candidate | None, message: str) -> None:
        if cand is None:
            return
        self.failed.setdefault(cand.name, {})[cand.version] = cand.fingerprint
        logger.error(
            "Model store: %s version %s will not take traffic until its files change: %s",
            cand.name,
            cand.version,
            message,
        )

    async def _unload(self, name: str, version: str) -> None:
        logger.info("Model store: unloading %s version %s", name, version)
        try:
            await self.registry.unregister(name, version)
        except ServeError as exc:
            logger.error("Could not unload %s version %s: %s", name, version, exc.message)
        self.owned.get(name, {}).pop(version, None)
