"""Version policies and swap plans: table tests of the pure functions."""

from __future__ import annotations

import pytest

from serve.store.version_policy import (
    PolicyError,
    VersionPlan,
    VersionPolicy,
    parse_policy,
    plan_versions,
    served_versions,
    sort_versions,
)

LATEST1 = VersionPolicy("latest", latest=1)
LATEST2 = VersionPolicy("latest", latest=2)
ALL = VersionPolicy("all")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, LATEST1),
        ("", LATEST1),
        ("all", ALL),
        ({"all": {}}, ALL),
        ("latest: 2", LATEST2),
        ("latest:3", VersionPolicy("latest", latest=3)),
        ({"latest": 2}, LATEST2),
        ({"latest": {"num_versions": 2}}, LATEST2),
        ('{"latest": 2}', LATEST2),
        ("specific: 1,3", VersionPolicy("specific", specific=("1", "3"))),
        ("specific: [1, 3]", VersionPolicy("specific", specific=("1", "3"))),
        ({"specific": [1, "2.0"]}, VersionPolicy("specific", specific=("1", "2.0"))),
        ({"specific": {"versions": [4]}}, VersionPolicy("specific", specific=("4",))),
    ],
)
def test_parse_policy(given: object, expected: VersionPolicy) -> None:
    assert parse_policy(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        "newest",
        "latest",
        "latest: 0",
        "latest: two",
        {"latest": -1},
        {"specific": []},
        {"latest": 1, "all": {}},
        {"oldest": 1},
        "{bad json",
        ["latest"],
    ],
)
def test_parse_policy_rejects(given: object) -> None:
    with pytest.raises(PolicyError):
        parse_policy(given)


def test_versions_sort_like_numbers() -> None:
    assert sort_versions(["10", "9", "1.10", "1.9", "2.0", "1.0"]) == [
        "1.0",
        "1.9",
        "1.10",
        "2.0",
        "9",
        "10",
    ]


@pytest.mark.parametrize(
    ("policy", "candidates", "served"),
    [
        (LATEST1, ["1", "2", "10"], ["10"]),
        (LATEST2, ["1", "2", "10"], ["2", "10"]),
        (LATEST2, ["1"], ["1"]),
        (ALL, ["3", "1", "2"], ["1", "2", "3"]),
        (VersionPolicy("specific", specific=("1", "3")), ["1", "2"], ["1"]),
        (LATEST1, [], []),
    ],
)
def test_served_versions(policy: VersionPolicy, candidates: list[str], served: list[str]) -> None:
    assert served_versions(policy, candidates) == served


# (policy, available, loaded, ready, failed, current default) -> plan
PLANS = [
    pytest.param(LATEST1, ["1"], [], [], [], None, VersionPlan(load=["1"]), id="first version"),
    pytest.param(
        LATEST1, ["1"], ["1"], ["1"], [], None, VersionPlan(default="1"), id="first ready"
    ),
    pytest.param(LATEST1, ["1"], ["1"], ["1"], [], "1", VersionPlan(), id="steady"),
    pytest.param(
        LATEST1,
        ["1", "2"],
        ["1"],
        ["1"],
        [],
        "1",
        VersionPlan(load=["2"]),
        id="new version: load it, keep the old default",
    ),
    pytest.param(
        LATEST1,
        ["1", "2"],
        ["1", "2"],
        ["1"],
        [],
        "1",
        VersionPlan(),
        id="new version loading: nothing moves",
    ),
    pytest.param(
        LATEST1,
        ["1", "2"],
        ["1", "2"],
        ["1", "2"],
        [],
        "1",
        VersionPlan(default="2", unload=["1"]),
        id="new version warm: swap, then unload the old",
    ),
    pytest.param(
        LATEST1,
        ["1", "2", "3"],
        ["2"],
        ["2"],
        ["3"],
        "2",
        VersionPlan(),
        id="broken newest: never served, the old one stays",
    ),
    pytest.param(
        LATEST1,
        ["1", "3"],
        ["2"],
        ["2"],
        ["3"],
        "2",
        VersionPlan(load=["1"]),
        id="serving version's files removed: roll back, keep serving until warm",
    ),
    pytest.param(
        LATEST1,
        ["1", "3"],
        ["1", "2"],
        ["1", "2"],
        ["3"],
        "2",
        VersionPlan(default="1", unload=["2"]),
        id="rollback warm",
    ),
    pytest.param(
        LATEST1,
        [],
        ["1"],
        ["1"],
        [],
        "1",
        VersionPlan(unload=["1"]),
        id="every file gone: unload",
    ),
    pytest.param(
        LATEST2, ["1", "2"], ["1"], ["1"], [], "1", VersionPlan(load=["2"]), id="latest 2: add"
    ),
    pytest.param(
        LATEST2,
        ["1", "2"],
        ["1", "2"],
        ["1", "2"],
        [],
        "1",
        VersionPlan(default="2"),
        id="latest 2: both served, default the highest",
    ),
    pytest.param(
        LATEST2,
        ["2", "3"],
        ["1", "2"],
        ["1", "2"],
        [],
        "2",
        VersionPlan(load=["3"], unload=["1"]),
        id="latest 2: old non-default unloads at once",
    ),
    pytest.param(
        ALL,
        ["1", "2", "3"],
        ["1", "3"],
        ["1", "3"],
        [],
        "3",
        VersionPlan(load=["2"]),
        id="all: a lower version joins, the default stays the highest",
    ),
    pytest.param(
        VersionPolicy("specific", specific=("1",)),
        ["1", "2"],
        ["1", "2"],
        ["1", "2"],
        [],
        "2",
        VersionPlan(default="1", unload=["2"]),
        id="specific pins an older version",
    ),
    pytest.param(
        VersionPolicy("specific", specific=("5",)),
        ["1"],
        ["1"],
        ["1"],
        [],
        "1",
        VersionPlan(),
        id="specific version absent: the serving one stays",
    ),
]


@pytest.mark.parametrize(
    ("policy", "available", "loaded", "ready", "failed", "default", "plan"), PLANS
)
def test_plan_versions(
    policy: VersionPolicy,
    available: list[str],
    loaded: list[str],
    ready: list[str],
    failed: list[str],
    default: str | None,
    plan: VersionPlan,
) -> None:
    assert plan_versions(policy, available, loaded, ready, failed, default) == plan
