"""TokenAuth's keys: TorchServe's key file, checks that fail closed, expiry and rotation."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from serve.config import Config
from serve.http.auth import TokenAuth
from serve.wire.errors import BadRequest, Unauthorized


def headers(token: str | None) -> dict[bytes, bytes]:
    return {} if token is None else {b"authorization": f"Bearer {token}".encode()}


def test_key_file_shape_and_permissions(tmp_path: Path) -> None:
    auth = TokenAuth(tmp_path / "key_file.json", ttl_minutes=60)
    path = tmp_path / "key_file.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert {k: set(v) for k, v in data.items()} == {
        "management": {"key", "expiration time"},
        "inference": {"key", "expiration time"},
        "API": {"key"},
    }
    assert {k: v["key"] for k, v in data.items()} == {k: v.key for k, v in auth.keys.items()}
    auth.remove_key_file()
    assert not path.exists()
    auth.remove_key_file()  # twice is fine


def test_check_accepts_only_the_right_key_for_the_kind(tmp_path: Path) -> None:
    auth = TokenAuth(tmp_path / "key_file.json", ttl_minutes=60)
    management = auth.keys["management"].key
    auth.check("management", headers(management))
    auth.check("management", {b"authorization": f"bearer  {management}".encode()})
    for given in (None, "", "wrong", auth.keys["inference"].key, management + "x"):
        with pytest.raises(Unauthorized) as info:
            auth.check("management", headers(given))
        assert info.value.status_code == 401
        assert info.value.headers == {"WWW-Authenticate": "Bearer"}
    with pytest.raises(Unauthorized):
        auth.check("management", {b"authorization": f"Token {management}".encode()})


def test_expired_keys_fail_but_the_api_key_never_expires(tmp_path: Path) -> None:
    auth = TokenAuth(tmp_path / "key_file.json", ttl_minutes=0)
    with pytest.raises(Unauthorized):
        auth.check("inference", headers(auth.keys["inference"].key))
    auth.check("API", headers(auth.keys["API"].key))


def test_rotation_replaces_one_key_in_memory_and_on_disk(tmp_path: Path) -> None:
    auth = TokenAuth(tmp_path / "key_file.json", ttl_minutes=60)
    old = auth.keys["inference"].key
    management = auth.keys["management"].key
    answer = auth.rotate("inference")
    new = answer["inference"]["key"]
    assert new != old
    on_disk = json.loads((tmp_path / "key_file.json").read_text())
    assert on_disk["inference"]["key"] == new
    assert on_disk["management"]["key"] == management
    with pytest.raises(Unauthorized):
        auth.check("inference", headers(old))
    auth.check("inference", headers(new))
    for kind in ("API", "", "MANAGEMENT"):
        with pytest.raises(BadRequest):
            auth.rotate(kind)


def test_defaults_are_safe() -> None:
    config = Config()
    for address in (config.inference_address, config.management_address, config.metrics_address):
        assert address.startswith("http://127.0.0.1:")
    assert config.enable_model_api is False
    assert config.disable_token_authorization is False
    assert config.allowed_urls == []


def test_fixed_keys_from_the_config_replace_generated_ones_and_never_expire(
    tmp_path: Path,
) -> None:
    config = Config.from_mapping(
        {
            "key_file": str(tmp_path / "key_file.json"),
            "inference_key": "from-a-secret",
            "token_expiration_min": 0,
        }
    )
    auth = TokenAuth.create(config)
    auth.check("inference", headers("from-a-secret"))  # ttl 0 would have expired a generated key
    with pytest.raises(Unauthorized):
        auth.check("management", headers("from-a-secret"))
    with pytest.raises(Unauthorized):
        auth.check("management", headers(auth.keys["management"].key))  # generated: expired
    data = json.loads((tmp_path / "key_file.json").read_text())
    assert data["inference"] == {"key": "from-a-secret"}
