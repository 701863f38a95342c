"""examples/config/lantern.yaml names every setting, and Lantern accepts it as it is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from serve.config import Config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config" / "lantern.yaml"


def test_the_example_names_every_setting_once() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert sorted(data) == sorted(f.name for f in dataclasses.fields(Config))
    keys = [
        line.split(":", 1)[0] for line in EXAMPLE.read_text().splitlines() if line[:1].isalpha()
    ]
    assert len(keys) == len(set(keys))


def test_the_example_is_accepted_with_the_defaults_it_claims() -> None:
    config = Config.load(config_file=EXAMPLE, env={})
    defaults = Config()
    changed = {
        f.name
        for f in dataclasses.fields(Config)
        if getattr(config, f.name) != getattr(defaults, f.name)
    }
    assert changed == {"model_store"}  # the one value the example sets on purpose
    assert config.model_store == "model_store"
