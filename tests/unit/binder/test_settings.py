"""Flags and environment become one frozen settings value."""

from __future__ import annotations

import dataclasses

import pytest

from gpushare.binder.__main__ import parse_settings as settings_from
from gpushare.binder.settings import BinderSettings
from gpushare.bus.connection import redact


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSHARE_NATS_URL", raising=False)
    monkeypatch.delenv("GPUSHARE_MEMORY_UNIT", raising=False)
    monkeypatch.delenv("GPUSHARE_RECONCILE_INTERVAL", raising=False)
    settings = settings_from([])
    assert settings == BinderSettings()
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.kubeconfig is None
    assert (settings.bind_timeout_s, settings.assign_timeout_s) == (120.0, 600.0)
    assert settings.reconcile_interval_s == 60.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.memory_unit = "GiB"  # type: ignore[misc]


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_NATS_URL", "nats://env:4222")
    monkeypatch.setenv("GPUSHARE_MEMORY_UNIT", "GiB")
    from_env = settings_from([])
    assert (from_env.nats_url, from_env.memory_unit) == ("nats://env:4222", "GiB")
    flags = settings_from(
        [
            *("--nats", "nats://flag:4222", "--memory-unit", "MiB"),
            *("--kubeconfig", "/tmp/kubeconfig", "--bind-timeout", "30"),
            *("--assign-timeout", "45", "--sweep-interval", "0.5"),
        ]
    )
    assert flags.nats_url == "nats://flag:4222"
    assert flags.memory_unit == "MiB"
    assert flags.kubeconfig == "/tmp/kubeconfig"
    assert (flags.bind_timeout_s, flags.assign_timeout_s, flags.sweep_interval_s) == (30, 45, 0.5)


def test_the_reconcile_interval_from_environment_then_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_RECONCILE_INTERVAL", "15")
    assert settings_from([]).reconcile_interval_s == 15
    assert settings_from(["--reconcile-interval", "0"]).reconcile_interval_s == 0
    monkeypatch.setenv("GPUSHARE_RECONCILE_INTERVAL", "soon")
    with pytest.raises(SystemExit):
        settings_from([])


def test_a_bad_memory_unit_is_refused() -> None:
    with pytest.raises(SystemExit):
        settings_from(["--memory-unit", "KiB"])


def test_credentials_never_reach_the_logs() -> None:
    urls = "nats://user:secret@a:4222,nats://b:4222,tls://token@c:4222"
    assert redact(urls) == "nats://***@a:4222,nats://b:4222,tls://***@c:4222"
