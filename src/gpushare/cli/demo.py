"""``gpushare demo``: the system on this machine, driven as kube-scheduler drives it.

It brings the stack up (`gpushare up`'s pieces), then through the extender over HTTP:

1. schedules the seed's sample deployment (``binpack-1``, 1024 MiB);
2. replays seed 000's **filter example**: three nodes of two 16276 MiB cards, where only
   N3 has 8138 MiB free on a single card; a pod asking 8138 MiB passes N3 alone;
3. replays seed 000's **bind example**: a node whose four cards have 12207, 8138, 4069
   and 16276 MiB free; binpack gives the 8138 MiB pod GPU1;

prints the per-card table and the allocation log, checks every outcome, and exits 0 only
if all of them are as the seed says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare.bus.credentials import NatsCredentials
from gpushare.bus.provenance import decode_from
from gpushare.bus.subjects import ALLOCATION_STREAM
from gpushare.cli.stack import Stack, StackConfig
from gpushare.core.requests import GPU_MEM, POLICY_ANNOTATION
from gpushare.embedded.scheduler import ExtenderClient
from gpushare.kube.client import KubeClient
from gpushare.reporter.settings import SimulatedNode

CARD = 16276
FILTER_NODES = ("n1", "n2", "n3")
BIND_NODE = "n4"
# What each node already runs, in the order the pods are scheduled (and deleted, "-name").
# Binpack fills the fullest card that fits, so N4's load is built by filling and freeing.
SETUP: dict[str, list[tuple[str, int]]] = {
    "n1": [("n1-a", 16276), ("n1-b", 12207)],
    "n2": [("n2-a", 12207), ("n2-b", 12207)],
    "n3": [("n3-a", 8138), ("n3-b", 16276)],
    BIND_NODE: [
        ("n4-a", 16276), ("n4-b", 16276), ("n4-c", 12207), ("n4-d", 4069), ("-n4-a", 0),
        ("n4-e", 4069), ("n4-x", 12207), ("-n4-b", 0), ("n4-f", 8138), ("-n4-x", 0),
        ("-n4-d", 0),
    ],
}  # fmt: skip


class DemoFailed(Exception):
    pass


def gpu_pod(name: str, mib: int, app: str = "gpushare-demo") -> dict[str, Any]:
    """A pod manifest asking ``mib`` of ``aliyun.com/gpu-mem``."""
    limits = {GPU_MEM: str(mib)}
    container = {
        "name": name if len(name) < 60 else "main",
        "image": "cheyang/gpu-player:v2",
        "resources": {"limits": limits, "requests": limits},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {"containers": [container], "schedulerName": "default-scheduler"},
    }


class Demo:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        kube = KubeClient.connect(stack.kubeconfig)
        self.api: Any = kube.core  # the official client, untyped upstream
        self.serialize: Any = kube.api_client.sanitize_for_serialization
        self.extender = ExtenderClient(stack.extender_url)
        self.checks: list[tuple[str, bool]] = []

    def check(self, what: str, ok: bool) -> None:
        self.checks.append((what, ok))
        print(f"  [{'ok' if ok else 'FAILED'}] {what}")

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        created = self.api.create_namespaced_pod("default", pod)
        return dict(self.serialize(created))

    def schedule(self, name: str, mib: int, nodes: list[str]) -> str | None:
        spec = gpu_pod(name, mib)
        # seed 000's walkthrough is binpack's; the cluster default policy is fragmentation
        spec["metadata"]["annotations"] = {POLICY_ANNOTATION: "binpack"}
        pod = self.create(spec)
        result = self.extender.schedule(pod, nodes)
        if result.node is None:
            raise DemoFailed(
                f"{name} ({mib} MiB) was not scheduled: {result.error or result.failed}"
            )
        self.wait_for(lambda: self.annotation(name, "ALIYUN_COM_GPU_MEM_ASSIGNED") == "true",
                      f"the device plugin to assign {name}")  # fmt: skip
        return result.node

    def delete(self, name: str) -> None:
        self.api.delete_namespaced_pod(name, "default")
        self.wait_for(lambda: not self.on_any_card(name), f"{name}'s release")

    def annotation(self, name: str, key: str) -> str | None:
        meta = self.api.read_namespaced_pod(name, "default").metadata
        return None if meta is None else (meta.annotations or {}).get(key)

    def inspect(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.stack.extender_url}/inspect", timeout=5) as reply:
            return dict(json.loads(reply.read()))

    def on_any_card(self, name: str) -> bool:
        return any(
            pod["name"] == name
            for node in self.inspect()["nodes"]
            for card in node["devs"]
            for pod in card["pods"]
        )

    def free_by_card(self, node: str) -> list[int]:
        nodes = {entry["name"]: entry for entry in self.inspect()["nodes"]}
        return [card["total_mib"] - card["used_mib"] for card in nodes[node]["devs"]]

    @staticmethod
    def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out waiting for {what}")
            time.sleep(0.05)

    def run(self) -> bool:
        print("\n== The seed's sample deployment (binpack-1, aliyun.com/gpu-mem: 1024)")
        node = self.schedule("binpack-1-5d8f7c9b4-x2x7q", 1024, ["n1", "n2", "n3", BIND_NODE])
        self.check(f"binpack-1 scheduled to {node} and assigned by the device plugin", True)
        self.delete("binpack-1-5d8f7c9b4-x2x7q")

        print("\n== Load the nodes as in seed 000's figures")
        for node_name, steps in SETUP.items():
            for name, mib in steps:
                if name.startswith("-"):
                    self.delete(name[1:])
                else:
                    self.schedule(name, mib, [node_name])
            print(f"  {node_name}: free per card {self.free_by_card(node_name)} MiB")
        self.filter_example()
        self.bind_example()
        return all(ok for _, ok in self.checks)

    def filter_example(self) -> None:
        print("\n== Seed 000 filter example: a pod asks 8138 MiB; N1, N2, N3 are candidates")
        pod = self.create(gpu_pod("filter-8138", 8138))
        passed, failed = self.extender.filter(pod, list(FILTER_NODES))
        for node in FILTER_NODES:
            print(
                f"  {node}: {'passes' if node in passed else 'filtered: ' + failed.get(node, '?')}"
            )
        self.check("only N3 passes the filter", passed == ["n3"])
        self.check("N1 and N2 are rejected with a reason", set(failed) == {"n1", "n2"})
        self.api.delete_namespaced_pod("filter-8138", "default")

    def bind_example(self) -> None:
        print(
            f"\n== Seed 000 bind example: {BIND_NODE}: 12207, 8138, 4069, 16276 MiB free per card"
        )
        self.check(f"{BIND_NODE} free per card is as in the figure",
                   self.free_by_card(BIND_NODE) == [12207, 8138, 4069, 16276])  # fmt: skip
        self.schedule("bind-8138", 8138, [BIND_NODE])
        index = self.annotation("bind-8138", "ALIYUN_COM_GPU_MEM_IDX")
        print(f"  bind chose GPU{index} (ALIYUN_COM_GPU_MEM_IDX={index})")
        self.check(
            "binpack chose GPU1, the card with the least free memory that fits", index == "1"
        )


def print_cards(inspect: dict[str, Any]) -> None:
    print("\n== Per-card allocation (GET /gpushare-scheduler/inspect)")
    print(f"  {'NODE':<6} {'GPU':<4} {'USED/TOTAL MiB':>16}  PODS")
    for node in inspect["nodes"]:
        for card in node["devs"]:
            pods = ", ".join(f"{p['name']}({p['mib']})" for p in card["pods"]) or "-"
            usage = f"{card['used_mib']}/{card['total_mib']}"
            print(f"  {node['name']:<6} {card['index']:<4} {usage:>16}  {pods}")


async def read_log(nats_url: str, credentials: NatsCredentials) -> list[str]:
    from gpushare.bus.connection import connect

    nc = await connect(nats_url, name="gpushare-demo", credentials=credentials)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(ALLOCATION_STREAM)).state.last_seq
        lines = []
        for seq in range(1, last + 1):
            raw = await js.get_msg(ALLOCATION_STREAM, seq=seq)
            assert raw.data is not None
            event = decode_from(raw.subject or "", raw.data)
            pod = getattr(event, "pod", None)
            who = f"{pod.namespace}/{pod.name}" if pod else ""
            kind = type(event).__name__
            lines.append(f"  {seq:>4} {event.at:%H:%M:%S.%f} {kind:<17} {event.node:<3} {who}")
        return lines
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    parse = argparse.ArgumentParser(prog="gpushare demo", description=__doc__.split("\n\n")[0])
    parse.add_argument("--data-dir", type=Path, help="keep state and logs here (default: temp)")
    parse.add_argument("--port", type=int, default=0, help="extender port (default: a free one)")
    args = parse.parse_args(argv)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="gpushare-demo-", dir="/tmp"))
    nodes = [SimulatedNode(name=name, cards_mib=(CARD, CARD)) for name in FILTER_NODES]
    nodes.append(SimulatedNode(name=BIND_NODE, cards_mib=(CARD,) * 4))
    stack = Stack(StackConfig(data_dir=data_dir.resolve(), nodes=nodes, extender_port=args.port))
    print(f"gpushare demo: starting NATS, the four services and 4 simulated nodes in {data_dir}")
    try:
        with stack:
            demo = Demo(stack)
            ok = demo.run()
            print_cards(demo.inspect())
            print("\n== The allocation log (stream GPUSHARE_ALLOCATIONS)")
            print("\n".join(asyncio.run(read_log(stack.nats_url, stack.credentials("auditor")))))
    except DemoFailed as error:
        print(f"\ngpushare demo FAILED: {error}\nlogs: {stack.logs_dir}", file=sys.stderr)
        return 1
    verdict = "all checks passed" if ok else "some checks FAILED"
    print(f"\ngpushare demo: {verdict} ({sum(ok for _, ok in demo.checks)}/{len(demo.checks)}).")
    return 0 if ok else 1
