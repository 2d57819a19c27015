"""The operator commands are reachable as ``gpushare <command>`` and ``kubectl gpushare``."""

from __future__ import annotations

import importlib

import pytest

from gpushare.cli import explain, inspect, kubectl_plugin
from gpushare.cli.main import COMMANDS, main, usage


@pytest.mark.parametrize("command", ["audit", "inspect", "explain"])
def test_each_operator_command_is_registered_with_a_main(command: str) -> None:
    module = importlib.import_module(COMMANDS[command][0])
    assert callable(module.main)
    assert f"  {command} " in usage()


@pytest.mark.parametrize("command", ["audit", "inspect", "explain"])
def test_each_command_takes_nats_and_json(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--nats" in text
    assert "--json" in text


def test_the_kubectl_plugin_is_inspect_under_kubectls_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        kubectl_plugin.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: kubectl gpushare [-h]")
    assert "[NODE]" in text
    assert "today's" in text  # the past view's cards are today's, and it says so


def test_inspect_at_reads_a_sequence_or_a_time() -> None:
    assert inspect.parse_args(["--at", "12"]).at == 12
    assert inspect.parse_args(["--at", "2026-01-01T00:00:00Z"]).at.year == 2026


@pytest.mark.parametrize(
    ("text", "pod"),
    [("ml/train", ("ml", "train")), ("train", ("default", "train"))],
)
def test_explain_reads_a_pod(text: str, pod: tuple[str, str]) -> None:
    assert explain.parse_args([text]).pod == pod


@pytest.mark.parametrize("text", ["ml/", "/train", "a/b/c", ""])
def test_explain_refuses_what_is_not_a_pod(text: str) -> None:
    with pytest.raises(SystemExit):
        explain.parse_args([text])
