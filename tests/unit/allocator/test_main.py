"""``gpushare allocator`` flags and environment."""

from __future__ import annotations

import pytest

from gpushare.allocator.__main__ import main, parse_settings
from gpushare.allocator.settings import AllocatorSettings


def test_defaults() -> None:
    settings = parse_settings([], {})
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.host == "0.0.0.0"
    assert settings.port == 39999
    assert settings.memory_unit == "MiB"
    assert settings.kubeconfig is None
    assert settings.bind_wait_seconds == 10.0
    assert settings.replica_id  # hostname-pid
    assert settings.url_prefix == "/gpushare-scheduler"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "in-cluster"),
        ({"KUBECONFIG": "/a/config:/b/config", "KUBERNETES_SERVICE_HOST": "x"}, "/a/config"),
    ],
)
def test_kubeconfig_defaults(environ: dict[str, str], expected: str | None) -> None:
    assert parse_settings([], environ).kubeconfig == expected


def test_environment_then_flags() -> None:
    environ = {
        "GPUSHARE_NATS_URL": "nats://nats:4222",
        "GPUSHARE_PORT": "8888",
        "GPUSHARE_MEMORY_UNIT": "GiB",
    }
    from_env = parse_settings([], environ)
    assert (from_env.nats_url, from_env.port, from_env.memory_unit) == (
        "nats://nats:4222",
        8888,
        "GiB",
    )
    flags = ["--nats", "nats://a:1", "--port", "1234", "--memory-unit", "MiB", "--id", "r1"]
    flags += ["--bind-wait", "2.5", "--kubeconfig", "in-cluster", "--host", "127.0.0.1"]
    assert parse_settings(flags, environ) == AllocatorSettings(
        nats_url="nats://a:1",
        host="127.0.0.1",
        port=1234,
        memory_unit="MiB",
        kubeconfig="in-cluster",
        replica_id="r1",
        bind_wait_seconds=2.5,
    )


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--memory-unit", "KiB"], {}),
        ([], {"GPUSHARE_MEMORY_UNIT": "bytes"}),
        ([], {"GPUSHARE_PORT": "http"}),
        (["--bind-wait", "0"], {}),
        (["--no-such-flag"], {}),
    ],
)
def test_bad_settings_exit_with_usage(argv: list[str], environ: dict[str, str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_settings(argv, environ)
    assert stopped.value.code == 2


def test_main_answers_help_and_bad_flags_without_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    assert "--bind-wait" in capsys.readouterr().out
    assert main(["--port", "x"]) == 2
