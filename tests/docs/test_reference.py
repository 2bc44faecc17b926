"""The site's reference pages are made from the code: every configuration key is there,
with its default and a meaning, and every command's help renders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpcsched.core import config
from tests.conftest import REPO

sys.path.insert(0, str(Path(REPO) / "docs" / "_ext"))
import hpcsched_reference as ref  # noqa: E402 - the docs' own extension


def test_every_configuration_key_is_in_the_reference_with_its_default_and_meaning():
    rows = {key: (default, meaning) for key, default, _, _, meaning in ref.configuration_rows()}
    assert set(rows) == set(config.DEFAULTS), set(config.DEFAULTS) ^ set(rows)
    page = ref.configuration_reference()
    for key, value in config.DEFAULTS.items():
        default, meaning = rows[key]
        assert meaning, f"{key} has no #: comment in its settings class: say what it means"
        assert f"| `{key}`<br>" in page and f"`{ref._cell(default)}`" in page
        assert default == ref._shown(value)


def test_environment_variable_named_in_the_reference_sets_its_key(monkeypatch):
    rows = {key: env for key, _, _, env, _ in ref.configuration_rows()}
    monkeypatch.setenv(rows["scheduler.worker-saturation"], "2.5")
    config.refresh()
    try:
        assert config.get("scheduler.worker-saturation") == 2.5
    finally:
        monkeypatch.delenv(rows["scheduler.worker-saturation"])
        config.refresh()


def test_configuration_page_asks_for_the_generated_table():
    page = (Path(REPO) / "docs" / "reference" / "configuration.md").read_text()
    assert ref.MARKER.format("configuration") in page


@pytest.mark.timeout(300)
def test_every_command_help_renders():
    text = ref.cli_reference()
    for title, _ in ref.COMMANDS:
        assert f"## `{title}`" in text
    assert "--scheduler-file" in text and "--array" in text and "--journal" in text
