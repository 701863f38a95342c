"""TF Serving's models.config read into the models Lantern serves (in-process table tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.store.tfs_config import ModelsConfigError, parse_models_config, single_model
from serve.store.version_policy import VersionPolicy

GOOD = """
model_config_list {
  config {
    name: "resnet"
    base_path: "/models/resnet"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 3 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 3 }
  }
  config { name: "scale" base_path: "scale" model_version_policy { all {} } }
  config { name: "plain" base_path: "plain" model_platform: "onnx" }
  config { name: "two" base_path: "two" model_version_policy { latest { num_versions: 2 } } }
}
"""


def test_a_models_config() -> None:
    models = {m.name: m for m in parse_models_config(GOOD, "models.config", Path("/srv"))}
    assert list(models) == ["resnet", "scale", "plain", "two"]
    resnet = models["resnet"]
    assert resnet.base_path == Path("/models/resnet") and resnet.platform == "tensorflow"
    assert resnet.policy == VersionPolicy("specific", specific=("1", "3"))
    assert resnet.labels == {"stable": "1", "canary": "3"}
    assert models["scale"].base_path == Path("/srv/scale")  # relative to the file's folder
    assert models["scale"].policy == VersionPolicy("all")
    assert models["plain"].policy == VersionPolicy()  # TF Serving's default: the latest one
    assert models["two"].policy == VersionPolicy("latest", latest=2)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('model_config_list { config { name: "a" base_path: "a" }', "not a ModelServerConfig"),
        ('model_config_list { config { name: "a" bse_path: "a" } }', "not a ModelServerConfig"),
        ('model_config_list { config { name: "a" } }', "needs a name and a base_path"),
        (
            'model_config_list { config { name: "a" base_path: "a" } '
            'config { name: "a" base_path: "b" } }',
            "listed twice",
        ),
        (
            'model_config_list { config { name: "a" base_path: "a" model_platform: "caffe" } }',
            "unknown model_platform 'caffe'",
        ),
        (
            'model_config_list { config { name: "a" base_path: "a" '
            "model_version_policy { specific {} } } }",
            "must list versions",
        ),
        ("custom_model_config {}", "custom_model_config is not supported"),
    ],
)
def test_bad_models_configs(text: str, fragment: str) -> None:
    with pytest.raises(ModelsConfigError) as caught:
        parse_models_config(text, "models.config", Path("/srv"))
    assert fragment in str(caught.value) and "models.config" in str(caught.value)


def test_single_model_start(tmp_path: Path) -> None:
    (model,) = single_model("resnet", str(tmp_path / "resnet"))
    assert model.name == "resnet" and model.base_path == tmp_path / "resnet"
    assert model.policy == VersionPolicy()


def test_tf_serving_start_settings(tmp_path: Path) -> None:
    from serve.config import Config, ConfigError

    tree = tmp_path / "models" / "half"
    config = Config.from_mapping({"model_name": "half", "model_base_path": str(tree)})
    assert config.model_store == str(tmp_path / "models")  # the tree's parent, as TF Serving's
    config = Config.from_mapping({"model_config_file": str(tmp_path / "models" / "models.config")})
    assert config.model_store == str(tmp_path / "models")
    given = Config.from_mapping({"model_config_file": "/a/m.config", "model_store": str(tmp_path)})
    assert given.model_store == str(tmp_path)
    with pytest.raises(ConfigError, match="needs a 'model_name'"):
        Config.from_mapping({"model_base_path": str(tree)})
    with pytest.raises(ConfigError, match="not both"):
        Config.from_mapping(
            {"model_name": "a", "model_base_path": str(tree), "model_config_file": "/m.config"}
        )


def test_savedmodel_layouts(tmp_path: Path) -> None:
    from serve.store import savedmodel
    from serve.store.layouts import recognise

    tree = tmp_path / "resnet"
    for version in ("1", "3"):
        (tree / version / "variables").mkdir(parents=True)
        (tree / version / "saved_model.pb").write_bytes(b"")
    (tree / "notes").mkdir()
    layout = recognise(tree)
    assert (layout.name, layout.kind, sorted(layout.versions)) == (
        "resnet",
        "versioned",
        ["1", "3"],
    )
    assert layout.model_config["metadata"]["platform"] == "tensorflow_savedmodel"
    archive = savedmodel.open_saved_model(layout, "3", tmp_path / "open")
    assert archive.manifest["model"]["serializedFile"] == "saved_model"
    assert (archive.model_dir / "saved_model").resolve() == (tree / "3").resolve()
    alone = recognise(tree / "3")  # one SavedModel folder: the version its name says
    assert (alone.name, list(alone.versions)) == ("resnet", ["3"])
    (tmp_path / "plain").mkdir()
    assert savedmodel.recognise_saved_model(tmp_path / "plain") is None


@pytest.mark.parametrize(
    ("text", "settings", "ignored"),
    [
        (
            "max_batch_size { value: 32 } batch_timeout_micros { value: 1500 } "
            "max_enqueued_batches { value: 10 } num_batch_threads { value: 2 }",
            {
                "batchSize": 32,
                "maxBatchDelay": 2,
                "jobQueueSize": 320,
                "minWorkers": 2,
                "maxWorkers": 2,
            },
            (),
        ),
        ("batch_timeout_micros { value: 0 }", {"maxBatchDelay": 0}, ()),
        (
            "max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 8 "
            'pad_variable_length_inputs: true thread_pool_name { value: "p" }',
            {"batchSize": 8},
            ("thread_pool_name", "allowed_batch_sizes", "pad_variable_length_inputs"),
        ),
        ("", {}, ()),
    ],
)
def test_batching_parameters(text: str, settings: dict[str, int], ignored: tuple[str, ...]) -> None:
    from serve.store.tfs_batching import parse_batching

    got = parse_batching(text, "batching.txt")
    assert got.settings == settings and got.not_honoured == ignored


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("max_batch_size { value: 0 }", "max_batch_size must be at least 1"),
        ("max_batch_size: 3", "not a BatchingParameters"),
        ("num_batch_threads { value: -1 }", "num_batch_threads must be at least 1"),
        ("batch_timeout_micros { value: -5 }", "cannot be negative"),
    ],
)
def test_bad_batching_parameters(text: str, fragment: str) -> None:
    from serve.store.tfs_batching import BatchingError, parse_batching

    with pytest.raises(BatchingError, match=fragment):
        parse_batching(text, "batching.txt")


def test_warmup_records(tmp_path: Path) -> None:
    from serve.grpc.tfs_warmup import WarmupError, read_records, read_warmup, write_records

    data = write_records([b"one", b"", b"three"])
    assert read_records(data, "w") == [b"one", b"", b"three"]
    with pytest.raises(WarmupError, match="truncated record at byte"):
        read_records(data[:-2], "w")
    with pytest.raises(WarmupError, match="truncated record header"):
        read_records(data + b"\0\0", "w")
    path = tmp_path / "warmup"
    path.write_bytes(write_records([b"\xff\xff"]))
    with pytest.raises(WarmupError, match="record 0 is not a PredictionLog"):
        read_warmup(path)


def test_tf_serving_port_flags() -> None:
    from serve.cli.main import _load_config, start

    options: dict[str, object] = {p.name: None for p in start.params if p.name}
    options.update(models=(), ncs=False, no_grpc=False, tfs_grpc_port=8500, tfs_rest_port=8501)
    config = _load_config(options)
    assert config.grpc_inference_port == 8500
    assert config.inference_address == "http://127.0.0.1:8501"  # Lantern's host, TF's port
    options.update(inference_address="http://0.0.0.0:8080")
    assert _load_config(options).inference_address == "http://0.0.0.0:8501"
