"""Model URL resolution: the model store by default, ``allowed_urls`` for anything else."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from serve.config import Config
from serve.store.sources import ModelLocation, ModelSources, check_traversal
from serve.wire.errors import BadRequest, Conflict, InvalidModelUrl, ModelNotFound


@pytest.fixture
def store(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    (folder / "sub").mkdir(parents=True)
    (folder / "echo.mar").write_bytes(b"archive")
    (folder / "sub" / "nested.mar").write_bytes(b"archive")
    (folder / "folder_model" / "MAR-INF").mkdir(parents=True)
    (tmp_path / "outside.mar").write_bytes(b"archive")
    return folder


def sources(store: Path, *allowed: str) -> ModelSources:
    return ModelSources(Config(model_store=str(store), allowed_urls=list(allowed)))


def resolve(src: ModelSources, url: str) -> ModelLocation:
    return asyncio.run(src.resolve(url))


def test_names_in_the_store_resolve(store: Path) -> None:
    src = sources(store)
    found = resolve(src, "echo.mar")
    assert found == ModelLocation(store.resolve() / "echo.mar", "echo.mar", downloaded=False)
    assert resolve(src, "sub/nested.mar").store_name == "sub/nested.mar"
    assert resolve(src, " folder_model ").path == store.resolve() / "folder_model"
    with pytest.raises(ModelNotFound, match="missing.mar"):
        resolve(src, "missing.mar")
    with pytest.raises(BadRequest, match="url is required"):
        resolve(src, "  ")


@pytest.mark.parametrize(
    "url",
    [
        "../outside.mar",
        "sub/../../outside.mar",
        "sub/..",
        "..\\outside.mar",
        "%2e%2e/outside.mar",
        "%252e%252e/outside.mar",
        ".%2E/outside.mar",
        "echo.mar\x00.txt",
        "http://example.com/models/../echo.mar",
        "http://example.com/models/%2e%2e/echo.mar",
    ],
)
def test_traversal_is_refused_in_any_spelling(store: Path, url: str) -> None:
    with pytest.raises(InvalidModelUrl, match="traversal"):
        check_traversal(url)
    # Refused even when a pattern would allow everything.
    with pytest.raises(InvalidModelUrl):
        resolve(sources(store, ".*"), url)


@pytest.mark.parametrize("url", ["echo.mar", "a..b.mar", "v1.2/model.mar", "http://h/x...mar"])
def test_dots_that_are_not_traversal_pass(url: str) -> None:
    check_traversal(url)


def test_a_symlink_out_of_the_store_is_refused(store: Path) -> None:
    (store / "link.mar").symlink_to(store.parent / "outside.mar")
    with pytest.raises(InvalidModelUrl, match="escapes the model store"):
        resolve(sources(store), "link.mar")


def test_absolute_paths_and_other_urls_are_refused_by_default(store: Path) -> None:
    src = sources(store)
    outside = store.parent / "outside.mar"
    for url in (str(outside), str(store / "echo.mar"), outside.as_uri()):
        with pytest.raises(InvalidModelUrl, match="allowed_urls"):
            resolve(src, url)
    for url in ("http://127.0.0.1:9/echo.mar", "https://example.com/echo.mar"):
        with pytest.raises(InvalidModelUrl, match="does not match any allowed URL"):
            resolve(src, url)
    with pytest.raises(InvalidModelUrl, match="not supported"):
        resolve(src, "s3://bucket/echo.mar")


def test_allowed_patterns_match_fully_and_ignore_case(store: Path) -> None:
    src = sources(store, r"https://models\.example\.com/.*")
    assert src.allowed("https://models.example.com/a.mar")
    assert src.allowed("HTTPS://MODELS.EXAMPLE.COM/a.mar")
    assert not src.allowed("https://models.example.com.evil.net/a.mar")
    assert not src.allowed("http://evil.net/?https://models.example.com/a.mar")
    assert not src.allowed("https://models.example.co")


def test_allowed_absolute_path_and_file_url(store: Path) -> None:
    outside = (store.parent / "outside.mar").resolve()
    src = sources(store, "file://" + re.escape(str(outside)))
    assert resolve(src, outside.as_uri()).path == outside
    assert resolve(src, str(outside)) == ModelLocation(outside, str(outside))


def test_download_url_must_name_an_archive_before_any_fetch(store: Path) -> None:
    # Port 9 (discard) is never connected to: the name is refused first.
    src = sources(store, r"http://127\.0\.0\.1:9/.*")
    for url in (
        "http://127.0.0.1:9/download?id=3",
        "http://127.0.0.1:9/",
        "http://127.0.0.1:9/.x.mar",
    ):
        with pytest.raises(InvalidModelUrl, match="model archive file name"):
            resolve(src, url)
    with pytest.raises(Conflict, match="already exists"):
        resolve(src, "http://127.0.0.1:9/models/echo.mar")


def test_download_failure_is_a_clean_400(store: Path) -> None:
    src = sources(store, r"http://127\.0\.0\.1:9/.*")
    with pytest.raises(BadRequest, match="Failed to download"):
        resolve(src, "http://127.0.0.1:9/fresh.mar")
    assert sorted(p.name for p in store.iterdir()) == ["echo.mar", "folder_model", "sub"]


def test_allowed_urls_from_the_environment() -> None:
    config = Config.load(env={"LANTERN_ALLOWED_URLS": r"http://a\.example/.*,https://b/.*"})
    assert config.allowed_urls == [r"http://a\.example/.*", "https://b/.*"]
    assert Config.load(env={}).allowed_urls == []
