"""Config precedence, TorchServe config.properties, and model settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.config import Config, ConfigError, ModelSettings, host_port


def test_defaults_bind_loopback_and_torchserve_ports() -> None:
    config = Config.load(env={})
    assert host_port(config.inference_address) == ("127.0.0.1", 8080)
    assert host_port(config.management_address) == ("127.0.0.1", 8081)
    assert host_port(config.metrics_address) == ("127.0.0.1", 8082)
    assert config.enable_model_api is False
    assert config.disable_token_authorization is False
    assert config.allowed_urls == []


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    props = tmp_path / "config.properties"
    props.write_text("job_queue_size=10\nbatch_size=2\nvmargs=-Xmx4g\nnumber_of_netty_threads=4\n")
    yml = tmp_path / "lantern.yaml"
    yml.write_text("batch_size: 3\nmax_batch_delay: 7\n")
    config = Config.load(
        ts_config_file=props,
        config_file=yml,
        env={"LANTERN_MAX_BATCH_DELAY": "9", "LANTERN_JOB_QUEUE_SIZE": "11"},
        overrides={"job_queue_size": 12, "model_store": None},
    )
    assert config.batch_size == 3  # yaml over properties
    assert config.max_batch_delay == 9  # env over yaml
    assert config.job_queue_size == 12  # flag over env


def test_properties_lists_and_booleans(tmp_path: Path) -> None:
    props = tmp_path / "config.properties"
    props.write_text(
        "# comment\nload_models=a.mar,b=b.mar\nallowed_urls=https://x/.*,file://.*\n"
        "enable_model_api=true\ninference_address=http://0.0.0.0:9080\n"
    )
    config = Config.load(ts_config_file=props, env={})
    assert config.load_models == ["a.mar", "b=b.mar"]
    assert config.allowed_urls == ["https://x/.*", "file://.*"]
    assert config.enable_model_api is True
    assert host_port(config.inference_address) == ("0.0.0.0", 9080)


def test_unknown_or_wrong_keys_are_named(tmp_path: Path) -> None:
    yml = tmp_path / "bad.yaml"
    yml.write_text("batch_sise: 3\n")
    with pytest.raises(ConfigError, match="batch_sise"):
        Config.load(config_file=yml, env={})
    with pytest.raises(ConfigError, match="job_queue_size"):
        Config.load(env={"LANTERN_JOB_QUEUE_SIZE": "many"})
    with pytest.raises(ConfigError, match="inference_address"):
        Config.load(overrides={"inference_address": "nowhere"}, env={})
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        Config.load(config_file=tmp_path / "list.yaml", env={})


def test_model_settings_layering_and_camel_case() -> None:
    base = Config.load(env={}).default_model_settings()
    archive = base.merged(
        {
            "batchSize": 8,
            "maxBatchDelay": 50,
            "minWorkers": 2,
            "deviceIds": [0, 1],
            "responseTimeout": "oops",
            "someHandlerKey": 1,
        }
    )
    assert (archive.batch_size, archive.max_batch_delay, archive.min_workers) == (8, 50, 2)
    assert archive.device_ids == [0, 1]
    assert archive.response_timeout == base.response_timeout  # wrong type ignored, logged
    call = archive.merged({"batch_size": 4})
    assert call.batch_size == 4 and call.min_workers == 2
    assert ModelSettings(response_timeout=10).effective_hard_timeout == 20


def test_service_envelope_from_properties(tmp_path: Path) -> None:
    props = tmp_path / "config.properties"
    props.write_text("service_envelope=kservev2\n")
    assert Config.load(ts_config_file=props, env={}).service_envelope == "kservev2"
    assert Config.load(env={}).service_envelope is None
    props.write_text("service_envelope=soap\n")
    with pytest.raises(ConfigError, match="service_envelope"):
        Config.load(ts_config_file=props, env={})
