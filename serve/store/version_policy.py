"""Which versions of a model to serve, and which one is the default: pure functions.

A policy is TF Serving's ``model_version_policy``: ``latest: N`` (the N highest versions),
``specific: [versions]`` or ``all``. `plan_versions` turns what the store holds and what is loaded
into the next steps of a swap: versions to load, the version to make the default (only one whose
workers are ready and warm), and versions to unload (never the default still serving).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

PolicyKind = Literal["latest", "specific", "all"]


class PolicyError(ValueError):
    """A version policy that cannot be understood; the message says what was given."""


@dataclass(frozen=True)
class VersionPolicy:
    kind: PolicyKind = "latest"
    latest: int = 1
    specific: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "latest":
            return f"latest: {self.latest}"
        if self.kind == "specific":
            return f"specific: [{', '.join(self.specific)}]"
        return "all"


DEFAULT_POLICY = VersionPolicy()


def parse_policy(value: Any) -> VersionPolicy:
    """``{"latest": 2}``, ``{"latest": {"num_versions": 2}}``, ``{"specific": ["1", "3"]}``,
    ``{"specific": {"versions": [1, 3]}}``, ``"all"``, ``{"all": {}}``, or text such as
    ``"latest: 2"``, ``"specific: 1,3"`` and JSON of any of these."""
    if isinstance(value, VersionPolicy):
        return value
    if value is None or value == "":
        return DEFAULT_POLICY
    if isinstance(value, str):
        return _parse_text(value.strip())
    if not isinstance(value, Mapping) or len(value) != 1:
        raise PolicyError(f"A version policy is one of latest, specific or all; got {value!r}")
    ((kind, arg),) = value.items()
    if kind == "all":
        return VersionPolicy("all")
    if kind == "latest":
        if isinstance(arg, Mapping):
            arg = arg.get("num_versions", 1)
        count = _int(arg, value)
        if count < 1:
            raise PolicyError(f"latest needs at least 1 version; got {value!r}")
        return VersionPolicy("latest", latest=count)
    if kind == "specific":
        if isinstance(arg, Mapping):
            arg = arg.get("versions", [])
        if isinstance(arg, (str, int, float)):
            arg = str(arg).split(",")
        versions = tuple(str(v).strip() for v in arg if str(v).strip())
        if not versions:
            raise PolicyError(f"specific needs at least one version; got {value!r}")
        return VersionPolicy("specific", specific=versions)
    raise PolicyError(f"Unknown version policy {kind!r}: use latest, specific or all")


def _parse_text(text: str) -> VersionPolicy:
    if text.startswith(("{", "[", '"')):
        try:
            return parse_policy(json.loads(text))
        except json.JSONDecodeError as exc:
            raise PolicyError(f"Invalid version policy {text!r}: {exc}") from exc
    kind, sep, arg = text.partition(":")
    kind = kind.strip()
    if kind == "all" and not arg.strip():
        return VersionPolicy("all")
    if not sep:
        raise PolicyError(f"Invalid version policy {text!r}: e.g. 'latest: 2', 'specific: 1,3'")
    arg = arg.strip().strip("[]")
    return parse_policy({kind: arg})


def _int(raw: Any, whole: Any) -> int:
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        return int(str(raw).strip())
    except ValueError:
        raise PolicyError(f"Invalid version policy {whole!r}: not a whole number") from None


_PART = re.compile(r"(\d+)|(\D+)")


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Orders versions the way people number them: ``"2" < "10"``, ``"1.9" < "1.10"``."""
    return tuple((1, int(num), "") if num else (0, 0, text) for num, text in _PART.findall(version))


def sort_versions(versions: Iterable[str]) -> list[str]:
    """Lowest first."""
    return sorted(versions, key=version_key)


def served_versions(policy: VersionPolicy, candidates: Iterable[str]) -> list[str]:
    """The versions the policy serves out of ``candidates`` (lowest first)."""
    ordered = sort_versions(set(candidates))
    if policy.kind == "all":
        return ordered
    if policy.kind == "latest":
        return ordered[-policy.latest :]
    wanted = set(policy.specific)
    return [v for v in ordered if v in wanted]


@dataclass(frozen=True)
class VersionPlan:
    """The next steps for one model: load these, then make that the default, then unload those."""

    load: list[str] = field(default_factory=list)
    default: str | None = None  # None: leave the default as it is
    unload: list[str] = field(default_factory=list)


def plan_versions(
    policy: VersionPolicy,
    available: Iterable[str],
    loaded: Iterable[str],
    ready: Iterable[str],
    failed: Iterable[str] = (),
    current_default: str | None = None,
) -> VersionPlan:
    """What to do next, given the complete versions in the store (``available``), the registered
    ones (``loaded``), those with warm workers (``ready``) and those that failed to load or warm
    up (``failed``: never served, until their files change).

    The default is the highest served version that is ready. A loaded version the policy no
    longer serves is unloaded, except the current default while nothing else can take over:
    traffic always has a warm version to go to.
    """
    failed_set = set(failed)
    served = served_versions(policy, (v for v in available if v not in failed_set))
    loaded_set, ready_set = set(loaded), set(ready)
    load = [v for v in served if v not in loaded_set]
    warm = [v for v in served if v in ready_set]
    default = warm[-1] if warm else None
    new_default = default or current_default
    keep = new_default if default is None and new_default is not None else None
    if keep is not None and not _still_wanted(keep, served, available):
        keep = None
    unload = [v for v in sort_versions(loaded_set) if v not in served and v != keep]
    if default == current_default:
        default = None
    return VersionPlan(load=load, default=default, unload=unload)


def _still_wanted(version: str, served: Sequence[str], available: Iterable[str]) -> bool:
    """Keep serving the old default until a served version is warm, unless nothing is coming:
    with no served version at all and its own files gone, the model goes."""
    return bool(served) or version in set(available)
