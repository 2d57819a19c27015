"""The committed ``services/<service>/settings.md`` tables are what the settings structs say."""

from __future__ import annotations

from tools import generate_settings


def test_the_settings_tables_are_up_to_date() -> None:
    assert generate_settings.main(["--check"]) == 0


def test_every_flag_of_every_service_is_in_its_table() -> None:
    for path, text in generate_settings.expected_files().items():
        assert "| `--nats` |" in text, path
