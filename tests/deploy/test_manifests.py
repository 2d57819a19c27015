"""Every overlay renders with ``kubectl kustomize`` into objects the Kubernetes 1.32
schemas accept (1.36 for the DRA objects; strict: no unknown field), and keeps the
deployment rules: pinned images, replicas and budgets, resources and security contexts
on every container, least-privilege RBAC per service, and network policies around every
component."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from tests.deploy.api_calls import Grant, grants_of, service_calls
from tests.deploy.manifests import (
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    PRODUCTION,
    Obj,
    containers,
    named,
    of_kind,
    pod_labels,
    render,
    selects,
    workloads,
)

SCHEMA_VERSION = "1.32"
DRA_SCHEMA_VERSION = "1.36"
"""``resource.k8s.io/v1`` (deploy/dra) is GA from 1.34; consumable capacity needs 1.36."""
CUSTOM_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
"""Objects of CRDs the schemas do not ship; cert-manager must be installed first."""
IMAGE = re.compile(r"^[a-z0-9.\-/:]+?:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127})$")


def test_every_overlay_is_tested() -> None:
    found = {path.name for path in (DEPLOY / "overlays").iterdir() if path.is_dir()}
    assert found == set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_match_the_kubernetes_schemas(overlay: str) -> None:
    unknown = []
    for obj in render(overlay):
        dra = obj["apiVersion"].startswith("resource.k8s.io/")
        try:
            kubernetes_validate.validate(
                obj, DRA_SCHEMA_VERSION if dra else SCHEMA_VERSION, strict=True
            )
        except kubernetes_validate.SchemaNotFoundError:
            unknown.append((obj["apiVersion"], obj["kind"]))
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {error.message}")
    assert set(unknown) <= CUSTOM_KINDS


def test_strict_validation_refuses_an_unknown_field() -> None:
    deployment = named(render("second-scheduler"), "Deployment", "gpushare-allocator")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaced_objects_live_in_gpushare_system(overlay: str) -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "DeviceClass",
    }
    elsewhere = {
        (obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        for obj in render(overlay)
        if obj["kind"] not in cluster_scoped and obj["metadata"].get("namespace") != NAMESPACE
    }
    allowed = {("RoleBinding", "gpushare-scheduler-authentication-reader", "kube-system")}
    assert elsewhere <= allowed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay: str) -> None:
    for workload in workloads(render(overlay)):
        for container in containers(workload):
            match = IMAGE.match(container["image"])
            assert match, f"{container['name']}: image {container['image']!r} has no tag"
            assert match["tag"] != "latest", container["image"]
            assert container.get("imagePullPolicy", "IfNotPresent") == "IfNotPresent"


@pytest.mark.parametrize("overlay", PRODUCTION)
def test_every_deployment_runs_two_replicas_under_a_budget(overlay: str) -> None:
    objects = render(overlay)
    budgets = of_kind(objects, "PodDisruptionBudget")
    deployments = of_kind(objects, "Deployment")
    expected = {"gpushare-allocator", "gpushare-binder"}
    if overlay == "second-scheduler":
        expected.add("gpushare-scheduler")
    assert {d["metadata"]["name"] for d in deployments} == expected
    for workload in [*deployments, *of_kind(objects, "StatefulSet")]:
        replicas = 3 if workload["kind"] == "StatefulSet" else 2
        assert workload["spec"]["replicas"] == replicas, workload["metadata"]["name"]
        covering = [b for b in budgets if selects(b["spec"]["selector"], pod_labels(workload))]
        assert len(covering) == 1, workload["metadata"]["name"]
        assert covering[0]["spec"]["minAvailable"] == replicas - 1


def test_dev_overlay_runs_one_of_each_on_simulated_cards() -> None:
    objects = render("dev")
    for deployment in of_kind(objects, "Deployment"):
        assert deployment["spec"]["replicas"] == 1
    names = {b["metadata"]["name"] for b in of_kind(objects, "PodDisruptionBudget")}
    assert names == {"gpushare-nats"}
    daemonset = named(objects, "DaemonSet", "gpushare-node")
    reporter = _container(daemonset, "reporter")
    assert "--simulate-if-no-gpu" in reporter["args"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_daemonset_serves_the_kubelet(overlay: str) -> None:
    daemonset = named(render(overlay), "DaemonSet", "gpushare-node")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpushare.io/gpu": "true"}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths.values()) == {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
    }
    agent = _container(daemonset, "node-agent")
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    for name, path in host_paths.items():
        assert mounts[name] == path
    assert {c["name"] for c in containers(daemonset)} == {"reporter", "node-agent"}
    # The reporter sees no kubelet path at all.
    reporter_mounts = {m["name"] for m in _container(daemonset, "reporter")["volumeMounts"]}
    assert not reporter_mounts & set(host_paths)


ROOT_CONTAINERS = {"node-agent"}
"""Containers that must run as root: the node-agent owns sockets in kubelet directories."""


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_resources_and_a_locked_down_security_context(overlay: str) -> None:
    for workload in workloads(render(overlay)):
        pod_context = workload["spec"]["template"]["spec"].get("securityContext", {})
        assert pod_context.get("seccompProfile") == {"type": "RuntimeDefault"}
        for container in containers(workload):
            where = f"{workload['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            for part in ("requests", "limits"):
                assert set(resources.get(part, {})) >= {"cpu", "memory"}, where
            context = container.get("securityContext")
            assert context, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert not context.get("privileged", False), where
            non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
            assert non_root is (container["name"] not in ROOT_CONTAINERS), where
            for port in container.get("ports", []):
                assert "hostPort" not in port, where
        spec = workload["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork"), workload["metadata"]
        assert not spec.get("hostPID"), workload["metadata"]


def _container(workload: Obj, name: str) -> Obj:
    [found] = [c for c in containers(workload) if c["name"] == name]
    return found


# --- RBAC --------------------------------------------------------------------------

OPT_IN: dict[Grant, str] = {
    ("scheduling.koordinator.sh", "devices", "get"): "--source=koordinator-device",
}
"""Calls a service makes only with a flag ``deploy/`` does not set (a test checks that it
does not), and which its role therefore does not grant: the reporter reading
Koordinator's Devices (then give the node pods a token and that verb yourself)."""
EXPECTED_GRANTS: dict[str, set[Grant]] = {
    "gpushare-allocator": service_calls("allocator"),
    "gpushare-binder": service_calls("binder"),
    "gpushare-node": (service_calls("node_agent") | service_calls("reporter")) - set(OPT_IN),
    "gpushare-nats": set(),
}
"""Every verb each ServiceAccount may use: what its service's calls through
``gpushare.kube`` need (``tests.deploy.api_calls``), nothing else."""
SCHEDULER_ROLES = {
    "ClusterRole/system:kube-scheduler",
    "ClusterRole/system:volume-scheduler",
    "Role/extension-apiserver-authentication-reader",
}
"""The built-in roles a kube-scheduler needs, bound to gpushare-scheduler."""
SCHEDULER_LEASE = {
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "update"),
}


def _grants(objects: tuple[Obj, ...]) -> tuple[dict[str, set[Grant]], dict[str, set[str]]]:
    """Per ServiceAccount: the (group, resource, verb) its rendered roles give, and the
    roles it is bound to that are not rendered (built into Kubernetes)."""
    roles = {
        (obj["kind"], obj["metadata"]["name"]): obj
        for obj in objects
        if obj["kind"] in ("Role", "ClusterRole")
    }
    grants: dict[str, set[Grant]] = {}
    builtin: dict[str, set[str]] = {}
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        ref = binding["roleRef"]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == NAMESPACE
            account = subject["name"]
            role = roles.get((ref["kind"], ref["name"]))
            if role is None:
                builtin.setdefault(account, set()).add(f"{ref['kind']}/{ref['name']}")
                continue
            for rule in role["rules"]:
                assert "*" not in rule["verbs"], rule
                assert "*" not in rule["resources"], rule
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            grants.setdefault(account, set()).add((group, resource, verb))
    return grants, builtin


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_account_gets_only_its_verbs(overlay: str) -> None:
    objects = render(overlay)
    grants, builtin = _grants(objects)
    accounts = {sa["metadata"]["name"] for sa in of_kind(objects, "ServiceAccount")}
    expected = dict(EXPECTED_GRANTS)
    if overlay != "default-scheduler":
        expected["gpushare-scheduler"] = SCHEDULER_LEASE
        assert builtin.pop("gpushare-scheduler") == SCHEDULER_ROLES
    assert builtin == {}
    assert accounts == set(expected)
    for account, verbs in expected.items():
        assert grants.get(account, set()) == verbs, account


def test_the_verbs_are_derived_from_the_calls_the_code_makes() -> None:
    """The derivation finds what each service is known to do, so that an empty or partial
    scan cannot pass the test above by also finding nothing in the roles."""
    assert grants_of("create_namespaced_pod_binding") == {("", "pods/binding", "create")}
    assert grants_of("list_pod_for_all_namespaces", watch=True) == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
    }
    custom = ("gpushare.io", "devices")
    assert grants_of("replace_cluster_custom_object_status", custom=custom) == {
        ("gpushare.io", "devices/status", "update")
    }
    # The allocator's bind checks: informers of pods and nodes, a GET when they cannot say;
    # and for scoring DRA pods, informers of their claims and claim templates.
    assert EXPECTED_GRANTS["gpushare-allocator"] == {
        (group, resource, verb)
        for group, resource in (("", "pods"), ("", "nodes"))
        for verb in ("get", "list", "watch")
    } | {
        ("resource.k8s.io", resource, verb)
        for resource in ("resourceclaims", "resourceclaimtemplates")
        for verb in ("list", "watch")
    }
    binder = EXPECTED_GRANTS["gpushare-binder"]
    assert {
        ("", "pods/binding", "create"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "nodes/status", "patch"),
        ("gpushare.io", "devices/status", "update"),
    } <= binder
    # The binder records no Kubernetes Events, and watches neither nodes nor Devices (the
    # DRA claims it records, it watches).
    assert not {grant for grant in binder if grant[1] == "events" or grant[2] == "watch"} - {
        ("", "pods", "watch"),
        ("resource.k8s.io", "resourceclaims", "watch"),
    }
    # A server-side apply creates: the slices need both verbs.
    assert {("resource.k8s.io", "resourceslices", verb) for verb in ("create", "patch")} <= binder
    assert EXPECTED_GRANTS["gpushare-node"] == set()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_container_turns_on_a_call_its_role_leaves_out(overlay: str) -> None:
    for workload in workloads(render(overlay)):
        for container in containers(workload):
            args = " ".join(container.get("args", [])).replace("--source ", "--source=")
            for flag in OPT_IN.values():
                assert flag not in args, (workload["metadata"]["name"], container["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_api_callers_get_a_token(overlay: str) -> None:
    objects = render(overlay)
    callers = {"gpushare-allocator", "gpushare-binder", "gpushare-scheduler"}
    tokens = {
        sa["metadata"]["name"]: sa.get("automountServiceAccountToken", True)
        for sa in of_kind(objects, "ServiceAccount")
    }
    for workload in workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        account = spec["serviceAccountName"]
        mounted = spec.get("automountServiceAccountToken", tokens[account])
        assert mounted is (account in callers), workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_component_has_its_own_service_account(overlay: str) -> None:
    """One account per component (the node DaemonSets of both front doors are one)."""
    accounts = {
        w["metadata"]["labels"]["app.kubernetes.io/component"]: w["spec"]["template"]["spec"][
            "serviceAccountName"
        ]
        for w in workloads(render(overlay))
    }
    assert len(accounts) == len(set(accounts.values()))
    assert "default" not in accounts.values()


# --- network policies ---------------------------------------------------------------


def _policies(objects: tuple[Obj, ...]) -> list[Obj]:
    return of_kind(objects, "NetworkPolicy")


def _ingress_ports(policies: list[Obj], labels: dict[str, str]) -> set[int]:
    ports: set[int] = set()
    for policy in policies:
        if selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get("ingress", []):
                ports |= {p["port"] for p in rule.get("ports", [])}
    return ports


def _egress_ports(policies: list[Obj], labels: dict[str, str]) -> set[int]:
    ports: set[int] = set()
    for policy in policies:
        if selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get("egress", []):
                ports |= {p["port"] for p in rule.get("ports", [])}
    return ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_deny_by_default_and_cover_every_component(overlay: str) -> None:
    objects = render(overlay)
    policies = _policies(objects)
    deny = named(objects, "NetworkPolicy", "default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for workload in workloads(objects):
        labels = pod_labels(workload)
        own = [
            p
            for p in policies
            if p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
            == labels["app.kubernetes.io/component"]
        ]
        assert own, f"no network policy of its own for {workload['metadata']['name']}"
        assert 53 in _egress_ports(policies, labels)
        # Every port a container listens on is reachable through some policy.
        listening = {p["containerPort"] for c in containers(workload) for p in c.get("ports", [])}
        assert listening <= _ingress_ports(policies, labels), workload["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_clients_and_routes_are_allowed(overlay: str) -> None:
    objects = render(overlay)
    policies = _policies(objects)
    nats = pod_labels(named(objects, "StatefulSet", "gpushare-nats"))
    assert {4222, 6222, 8222} <= _ingress_ports(policies, nats)
    assert 6222 in _egress_ports(policies, nats)
    for workload in workloads(objects):
        env = {e["name"] for c in containers(workload) for e in c.get("env", [])}
        if "GPUSHARE_NATS_USER" in env:
            labels = pod_labels(workload)
            assert labels.get("gpushare.io/nats-client") == "true", workload["metadata"]
            assert 4222 in _egress_ports(policies, labels)
    [client_rule] = [
        rule
        for rule in named(objects, "NetworkPolicy", "nats")["spec"]["ingress"]
        if rule["ports"] == [{"protocol": "TCP", "port": 4222}]
    ]
    sources = [peer["podSelector"]["matchLabels"] for peer in client_rule["from"]]
    assert {"gpushare.io/nats-client": "true"} in sources


def test_scheduler_may_call_the_allocator() -> None:
    objects = render("second-scheduler")
    scheduler = pod_labels(named(objects, "Deployment", "gpushare-scheduler"))
    assert 39999 in _egress_ports(_policies(objects), scheduler)
    allocator = pod_labels(named(objects, "Deployment", "gpushare-allocator"))
    assert 39999 in _ingress_ports(_policies(objects), allocator)
    same_namespace = [
        peer["podSelector"]
        for peer in _ingress_peers(_policies(objects), allocator)
        if set(peer) == {"podSelector"}
    ]
    assert any(selects(selector, scheduler) for selector in same_namespace)


def _ingress_peers(policies: list[Obj], labels: dict[str, str]) -> list[Obj]:
    """Every ``from`` peer of every policy selecting ``labels``; a rule without one (any
    source) fails the test at once."""
    peers: list[Obj] = []
    for policy in policies:
        if selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get("ingress", []):
                name = policy["metadata"]["name"]
                assert rule.get("from"), f"{name}: a rule admits any source"
                assert rule["ports"] == [{"protocol": "TCP", "port": 39999}], name
                peers.extend(rule["from"])
    return peers


KUBE_SCHEDULER_PODS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"component": "kube-scheduler"}},
}
"""kube-scheduler running as a pod in kube-system (labelled as kubeadm labels it)."""
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
PRIVATE_RANGES = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_schedulers_the_control_plane_and_prometheus_reach_the_allocator(
    overlay: str,
) -> None:
    objects = render(overlay)
    allocator = pod_labels(named(objects, "Deployment", "gpushare-allocator"))
    peers = _ingress_peers(_policies(objects), allocator)
    assert KUBE_SCHEDULER_PODS in peers
    assert PROMETHEUS in peers
    blocks = {peer["ipBlock"]["cidr"] for peer in peers if "ipBlock" in peer}
    # kube-apiserver (the webhook) and a host-network kube-scheduler: the control plane's
    # addresses, to be set per cluster; never "anywhere".
    assert blocks
    assert not blocks & {"0.0.0.0/0", "::/0"}
    if overlay == "dev":
        assert blocks == PRIVATE_RANGES
    else:
        assert blocks == {"192.0.2.0/24"}  # TEST-NET-1: matches nothing until it is set
    for peer in peers:
        assert set(peer) in (
            {"ipBlock"},
            {"podSelector"},
            {"namespaceSelector"},
            set(KUBE_SCHEDULER_PODS),
        ), peer
        if set(peer) == {"podSelector"}:  # this namespace: only the second scheduler
            assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
