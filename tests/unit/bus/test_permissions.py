"""Who may publish what: the roles' allow and deny lists (pure)."""

from __future__ import annotations

import re

import pytest

from gpushare.bus.permissions import (
    DESTRUCTIVE,
    User,
    admin,
    allocator,
    auditor,
    binder,
    node,
    render_auth_conf,
    users,
)
from gpushare.bus.subjects import (
    ALLOCATION_STREAM,
    WRITERS,
    Writer,
    allocation_subject,
    inventory_subject,
)


def allowed(patterns: tuple[str, ...], subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    for pattern in patterns:
        wanted, given = pattern.split("."), subject.split(".")
        for index, token in enumerate(wanted):
            if token == ">":
                if len(given) > index:
                    return True
                break
            if index >= len(given) or token not in ("*", given[index]):
                break
        else:
            if len(wanted) == len(given):
                return True
    return False


def may_publish(user: User, subject: str) -> bool:
    perms = user.permissions
    assert perms is not None
    return allowed(perms.publish, subject) and not allowed(perms.deny_publish, subject)


def test_a_node_publishes_only_its_own_subjects() -> None:
    user = node("gpu.a")
    assert may_publish(user, inventory_subject("gpu.a"))
    assert may_publish(user, allocation_subject("gpu.a", "agent"))
    assert not may_publish(user, inventory_subject("gpu.b"))
    assert not may_publish(user, allocation_subject("gpu.b", "agent"))
    assert not may_publish(user, allocation_subject("gpu.a", "allocator"))
    assert not may_publish(user, allocation_subject("gpu.a", "binder"))


@pytest.mark.parametrize(("user", "writer"), [(allocator(), "allocator"), (binder(), "binder")])
def test_each_service_appends_only_as_itself(user: User, writer: Writer) -> None:
    for other in WRITERS:
        assert may_publish(user, allocation_subject("n", other)) == (other == writer)


@pytest.mark.parametrize("user", [allocator(), binder(), node("n"), auditor()])
@pytest.mark.parametrize("call", DESTRUCTIVE)
def test_no_service_may_rewrite_the_allocation_log(user: User, call: str) -> None:
    assert not may_publish(user, f"$JS.API.{call}.{ALLOCATION_STREAM}")


def test_the_auditor_publishes_no_event_and_admin_is_unrestricted() -> None:
    assert not may_publish(auditor(), allocation_subject("n", "allocator"))
    assert not may_publish(auditor(), inventory_subject("n"))
    assert admin().permissions is None


def test_the_rendered_config_names_passwords_only_by_variable() -> None:
    text = render_auth_conf(users(["gpu-a"]))
    passwords = re.findall(r"password: (\S+)", text)
    assert passwords == [
        "$GPUSHARE_NATS_PASSWORD_ALLOCATOR",
        "$GPUSHARE_NATS_PASSWORD_BINDER",
        "$GPUSHARE_NATS_PASSWORD_NODE_GPU_A",
        "$GPUSHARE_NATS_PASSWORD_AUDITOR",
        "$GPUSHARE_NATS_PASSWORD_ADMIN",
    ]
