"""Who may publish and subscribe to what on NATS, and the nats-server config that says so.

Pure: roles in, allow and deny lists out, rendered as nats-server ``authorization``
text. Users per role: ``allocator`` (the only one that reserves), ``binder`` (binds,
releases, adopts), ``node-<node>`` (that node's reporter and node agent: its own
inventory subject and its own agent subject only), ``auditor`` (reads) and ``admin``
(everything). Nobody but ``admin`` may delete, purge, update or remove messages from
the allocation log (and the stream's ``deny_delete``/``deny_purge`` refuse even admin).

Passwords are never here: each user's is an environment variable reference
(``$GPUSHARE_NATS_PASSWORD_ALLOCATOR``) resolved by nats-server when it starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpushare.bus.subjects import (
    ALL_AGENTS_READY,
    ALL_DECISIONS,
    ALL_REJECTED,
    ALLOCATION_PREFIX,
    ALLOCATION_STREAM,
    BINDER_QUEUE_STREAM,
    DECISION_STREAM,
    INVENTORY_STREAM,
    REJECTED_STREAM,
    SNAPSHOT_BUCKET,
    agent_ready_subject,
    inventory_subject,
    node_token,
)

API = "$JS.API"
SNAPSHOT_STREAM = f"KV_{SNAPSHOT_BUCKET}"
SNAPSHOT_SUBJECTS = f"$KV.{SNAPSHOT_BUCKET}.>"
INBOX = "_INBOX"
"""nats-py's default reply prefix; each of our users gets its own (:func:`inbox_prefix`)."""
STREAMS = (INVENTORY_STREAM, ALLOCATION_STREAM, DECISION_STREAM, REJECTED_STREAM, SNAPSHOT_STREAM)
"""The streams every service reads."""
ALL_STREAMS = (*STREAMS, BINDER_QUEUE_STREAM)
"""Every stream ``ensure_streams`` creates; the binders' queue is only theirs to consume."""
PASSWORD_ENV_PREFIX = "GPUSHARE_NATS_PASSWORD_"
BINDER_CONSUMER = "binder"
"""The durable pull consumer all binder replicas share on the allocation log (the default
of ``BinderSettings.consumer``)."""
DESTRUCTIVE = ("STREAM.DELETE", "STREAM.PURGE", "STREAM.UPDATE", "STREAM.MSG.DELETE")
"""The stream API calls only ``admin`` may make on the audit streams."""


def inbox_prefix(user: str) -> str:
    """Where ``user``'s replies (JetStream API answers, publish acks) and push consumers'
    deliveries arrive: ``_INBOX_<user>``. A user may subscribe to its own inboxes only, so
    no service can read another's replies."""
    return f"{INBOX}_{re.sub(r'[^A-Za-z0-9_-]', '_', user)}"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False
    """May answer the requests it receives (publish once to their reply subjects)."""


@dataclass(frozen=True)
class User:
    name: str
    permissions: Permissions | None
    """None: no restriction (admin)."""

    @property
    def password_env(self) -> str:
        """The environment variable nats-server reads this user's password from."""
        return PASSWORD_ENV_PREFIX + re.sub(r"[^A-Z0-9]", "_", self.name.upper())


def reading(stream: str) -> tuple[str, ...]:
    """The API subjects to look at ``stream``: info, direct and stored gets, and ephemeral
    consumers (nats-py's ordered consumers: created unnamed, no acks, flow control).
    Not pulling from, acknowledging or changing a named consumer: the only one is the
    binders' (:func:`consuming`). Not deleting a consumer: no service does (ephemeral ones
    expire), and no user may remove the binders' shared durable one."""
    return (
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.DIRECT.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}.>",
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"$JS.FC.{stream}.>",
    )


def consuming(stream: str, consumer: str) -> tuple[str, ...]:
    """Creating (or updating), pulling from and acknowledging the named durable pull
    ``consumer`` on ``stream``: the binders' own on their queue, nobody else's.

    It cannot live on the allocation log itself: everyone reading the log creates
    ephemeral consumers there, and ``CONSUMER.CREATE.<stream>`` with a ``name`` in the
    request body updates the consumer of that name, whatever the subject allows."""
    return (
        f"{API}.CONSUMER.INFO.{stream}.{consumer}",
        f"{API}.CONSUMER.DURABLE.CREATE.{stream}.{consumer}",
        f"{API}.CONSUMER.CREATE.{stream}.{consumer}",
        f"{API}.CONSUMER.CREATE.{stream}.{consumer}.>",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    )


def creating(streams: Iterable[str]) -> tuple[str, ...]:
    """Creating a stream that does not exist yet (``ensure_streams`` on first start)."""
    return tuple(f"{API}.STREAM.CREATE.{stream}" for stream in streams)


def guarding() -> tuple[str, ...]:
    """Denied to every service: what would rewrite the audit trail."""
    return tuple(
        f"{API}.{call}.{s}"
        for s in (ALLOCATION_STREAM, REJECTED_STREAM, BINDER_QUEUE_STREAM)
        for call in DESTRUCTIVE
    )


def _reads(*streams: str) -> tuple[str, ...]:
    return (f"{API}.INFO", *(subject for stream in streams for subject in reading(stream)))


def _service(user: str, *publish: str) -> Permissions:
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=(f"{inbox_prefix(user)}.>",),
        deny_publish=guarding(),
    )


def allocator() -> User:
    return User(
        "allocator",
        _service(
            "allocator",
            f"{ALLOCATION_PREFIX}.*.allocator",
            ALL_DECISIONS,
            ALL_REJECTED,
            SNAPSHOT_SUBJECTS,
            *_reads(*STREAMS),
            f"{API}.STREAM.INFO.{BINDER_QUEUE_STREAM}",
            *creating(ALL_STREAMS),
        ),
    )


def binder() -> User:
    return User(
        "binder",
        _service(
            "binder",
            f"{ALLOCATION_PREFIX}.*.binder",
            ALL_AGENTS_READY,
            ALL_REJECTED,
            SNAPSHOT_SUBJECTS,
            *_reads(*STREAMS),
            f"{API}.STREAM.INFO.{BINDER_QUEUE_STREAM}",
            *consuming(BINDER_QUEUE_STREAM, BINDER_CONSUMER),
            *creating(ALL_STREAMS),
        ),
    )


def node(name: str) -> User:
    """A node's reporter and node agent (one user: they run on the same node); the agent
    answers the binder's readiness requests for its own node only."""
    user = f"node-{name}"
    service = _service(
        user,
        inventory_subject(name),
        f"{ALLOCATION_PREFIX}.{node_token(name)}.agent",
        ALL_REJECTED,
        *_reads(INVENTORY_STREAM, ALLOCATION_STREAM, REJECTED_STREAM, SNAPSHOT_STREAM),
        *(f"{API}.STREAM.INFO.{stream}" for stream in ALL_STREAMS),  # ensure_streams checks
    )
    return User(
        user,
        replace(
            service,
            subscribe=(*service.subscribe, agent_ready_subject(name)),
            allow_responses=True,
        ),
    )


def auditor() -> User:
    return User(
        "auditor",
        _service("auditor", *_reads(*STREAMS), f"{API}.STREAM.INFO.{BINDER_QUEUE_STREAM}"),
    )


def admin() -> User:
    return User("admin", None)


def users(nodes: Iterable[str]) -> tuple[User, ...]:
    return (allocator(), binder(), *(node(name) for name in nodes), auditor(), admin())


def _quoted(subjects: tuple[str, ...], indent: str) -> str:
    return "".join(f'{indent}"{subject}"\n' for subject in subjects)


def _render_user(user: User) -> str:
    head = f'    {{\n      user: "{user.name}"\n      password: ${user.password_env}\n'
    perms = user.permissions
    if perms is None:
        return head + "    }\n"
    pad = " " * 10
    text = head + "      permissions: {\n        publish: {\n          allow: [\n"
    text += _quoted(perms.publish, pad + "  ") + f"{pad}]\n"
    if perms.deny_publish:
        text += f"{pad}deny: [\n" + _quoted(perms.deny_publish, pad + "  ") + f"{pad}]\n"
    text += "        }\n        subscribe: {\n          allow: [\n"
    text += _quoted(perms.subscribe, pad + "  ") + f"{pad}]\n        }}\n"
    if perms.allow_responses:
        text += "        allow_responses: true\n"
    return text + "      }\n    }\n"


def render_auth_conf(all_users: Iterable[User]) -> str:
    """nats-server ``authorization`` block (include it from the server's config)."""
    body = "".join(_render_user(user) for user in all_users)
    return (
        "# Generated by tools/generate_nats_auth.py from gpushare.bus.permissions: do not edit.\n"
        "# Passwords are environment variables of nats-server (GPUSHARE_NATS_PASSWORD_*).\n"
        f"authorization {{\n  users: [\n{body}  ]\n}}\n"
    )
