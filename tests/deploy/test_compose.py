"""``compose.yaml`` and ``deploy/compose/``, checked offline (there is no docker here).

The file must parse, name every service it needs, pin every image it pulls, mount only
files that exist, start the gpushare services with subcommands and flags their own
parsers accept, scrape every metrics port those flags open, and draw dashboards only
from metrics the services really export (found by reading ``src/gpushare/`` now, so a
renamed metric breaks this test rather than the dashboard).
"""

from __future__ import annotations

import ast
import json
import os
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.allocator.card_gauges import GAUGES, LABELS
from gpushare.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
CONFIG = ROOT / "deploy" / "compose"
DASHBOARDS = CONFIG / "grafana" / "dashboards"
DATASOURCES = CONFIG / "grafana" / "provisioning" / "datasources"
SERVICES_SOURCE = ROOT / "src" / "gpushare"

GPUSHARE_IMAGE = "gpushare:dev"
NODES = ("gpu-a", "gpu-b")
REQUIRED = {
    "nats",
    "kube-api",
    "allocator",
    "binder",
    "otel-collector",
    "tempo",
    "prometheus",
    "grafana",
    *(f"{kind}-{node}" for node in NODES for kind in ("reporter", "node-agent", "kubelet")),
}
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def load_yaml(path: Path) -> Any:
    with path.open() as file:
        return yaml.safe_load(file)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = load_yaml(COMPOSE)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


def gpushare_services(services: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in services.items() if spec["image"] == GPUSHARE_IMAGE}


def environment(spec: Mapping[str, Any]) -> dict[str, str]:
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def flags(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == name]


# -- the compose file itself -------------------------------------------------------------


def test_every_required_service_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= REQUIRED, sorted(REQUIRED - set(services))


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    built = {spec["image"] for spec in services.values() if "build" in spec}
    assert built == {GPUSHARE_IMAGE}
    for name, spec in services.items():
        image = spec["image"]
        if image in built:
            continue
        assert "build" not in spec, name
        if "@sha256:" in image:
            continue
        repository, _, tag = image.rpartition(":")
        assert repository, f"{name}: image {image!r} has no tag"
        assert "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag not in {"latest", "main", "nightly", "edge"}, f"{name}: {image!r}"
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{name}: {image!r} is not an exact version"


def test_the_gpushare_image_is_built_here(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in gpushare_services(services).items():
        if "build" in spec:
            context = spec["build"] if isinstance(spec["build"], str) else spec["build"]["context"]
            dockerfile = ROOT / context / "Dockerfile"
            assert dockerfile.is_file(), name
            assert re.search(r'^ENTRYPOINT \["gpushare"\]', dockerfile.read_text(), re.M), name
        else:
            assert spec.get("pull_policy") == "never", f"{name} would try to pull {GPUSHARE_IMAGE}"


def test_mounted_files_exist_and_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, spec in compose["services"].items():
        for volume in spec.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"


def test_dependencies_exist_and_are_healthchecked(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in services.items():
        for dependency, rule in (spec.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if rule.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    for name in ("nats", "kube-api", "allocator"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    for name in gpushare_services(services):
        if name not in {"kube-api"}:
            assert services[name]["depends_on"], name


def test_every_service_restarts(services: dict[str, dict[str, Any]]) -> None:
    for name, spec in services.items():
        assert spec.get("restart") in {"unless-stopped", "always", "on-failure"}, name


def test_nats_runs_jetstream_with_a_store_and_monitoring(
    services: dict[str, dict[str, Any]],
) -> None:
    nats = services["nats"]
    command = nats["command"]
    assert "-js" in command
    store = flag(command, "-sd")
    assert store == "/data"
    assert any(volume.endswith(f":{store}") for volume in nats["volumes"])
    assert flag(command, "-m") == "8222"
    assert "8222/healthz" in " ".join(nats["healthcheck"]["test"])
    for name, spec in gpushare_services(services).items():
        assert environment(spec)["GPUSHARE_NATS_URL"] == "nats://nats:4222", name


# -- the gpushare commands, checked by the services' own parsers ----------------------------


class Parsed(Exception):
    def __init__(self, args: object) -> None:
        super().__init__("parsed")
        self.args_seen = args


def parse_kubelet(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    from gpushare.embedded import kubelet

    def run(coroutine: object) -> None:
        raise Parsed(coroutine)

    monkeypatch.setattr(kubelet, "_serve", lambda nodes, kubeconfig: (nodes, kubeconfig))
    monkeypatch.setattr(kubelet, "asyncio", types.SimpleNamespace(run=run))
    monkeypatch.setattr(kubelet, "setup_logging", lambda name: None)
    with pytest.raises(Parsed) as parsed:
        kubelet.main(argv)
    nodes, _ = parsed.value.args_seen  # type: ignore[misc]
    assert nodes
    return list(nodes)


def parse_command(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> object:
    """What the service makes of ``argv`` (its own parser); fails on a flag it rejects."""
    command, rest = argv[0], argv[1:]
    if command == "allocator":
        from gpushare.allocator.__main__ import parse_settings

        return parse_settings(rest, os.environ)
    if command == "binder":
        from gpushare.binder.__main__ import parse_settings as parse_binder

        return parse_binder(rest, os.environ)
    if command == "reporter":
        from gpushare.reporter.__main__ import parse_settings as parse_reporter

        return parse_reporter(rest, os.environ)
    if command == "node-agent":
        from gpushare.node_agent.__main__ import parse_settings as parse_agent

        settings = parse_agent(rest, os.environ)
        return settings, settings.targets
    if command == "kube-api":
        from gpushare.embedded.kube_api import parser

        return parser().parse_args(rest)
    if command == "kubelet":
        return parse_kubelet(rest, monkeypatch)
    raise AssertionError(f"{name}: no parser known for gpushare {command}")


def test_commands_are_real_subcommands_and_flags(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, spec in gpushare_services(services).items():
        argv = [str(arg) for arg in spec["command"]]
        assert argv[0] in COMMANDS, f"{name}: gpushare has no command {argv[0]!r}"
        with monkeypatch.context() as patch:
            for key, value in environment(spec).items():
                patch.setenv(key, value)
            try:
                parse_command(name, argv, patch)
            except SystemExit as exit_:
                pytest.fail(f"{name}: gpushare {' '.join(argv)} exits {exit_.code}")


def test_gpushare_environment_variables_are_read_somewhere(
    services: dict[str, dict[str, Any]],
) -> None:
    source = "".join(path.read_text() for path in SERVICES_SOURCE.rglob("*.py"))
    for name, spec in gpushare_services(services).items():
        for variable in environment(spec):
            if variable.startswith(("GPUSHARE_", "OTEL_")) and variable != "OTEL_SERVICE_NAME":
                assert variable in source, f"{name}: nothing reads {variable}"


def test_simulated_nodes_agree_across_services(services: dict[str, dict[str, Any]]) -> None:
    kube_nodes = flags(services["kube-api"]["command"], "--node")
    assert sorted(kube_nodes) == sorted(NODES)
    for node in NODES:
        reporter = services[f"reporter-{node}"]["command"]
        assert [spec.split("=")[0] for spec in flags(reporter, "--node")] == [node]
        agent, kubelet = services[f"node-agent-{node}"], services[f"kubelet-{node}"]
        assert flags(agent["command"], "--node") == [f"{node}={PLUGIN_DIR}"]
        assert flags(kubelet["command"], "--node") == [f"{node}={PLUGIN_DIR}"]
        shared = {v for v in agent["volumes"] if not v.startswith(".")}
        shared &= set(kubelet["volumes"])
        assert any(PLUGIN_DIR.startswith(volume.split(":")[1]) for volume in shared), (
            f"{node}: node-agent and kubelet share no device-plugins directory"
        )
        # a fresh named volume is root's; the image's default user could not write it
        assert agent.get("user") == kubelet.get("user") == "0:0", node


def test_kubeconfig_points_at_the_api_stand_in(services: dict[str, dict[str, Any]]) -> None:
    config = load_yaml(CONFIG / "kubeconfig.yaml")
    server = config["clusters"][0]["cluster"]["server"]
    port = flag(services["kube-api"]["command"], "--port")
    assert server == f"http://kube-api:{port}"
    assert flag(services["kube-api"]["command"], "--host") == "0.0.0.0"


# -- metrics ports and Prometheus ---------------------------------------------------------


def metrics_port(spec: Mapping[str, Any]) -> int | None:
    """The port a gpushare service serves /metrics on, as its command and env set it."""
    argv = [str(arg) for arg in spec["command"]]
    if argv[0] == "allocator":
        return int(flag(argv, "--port") or 39999)
    if "--metrics-port" in argv:
        return int(flag(argv, "--metrics-port") or 0)
    port = environment(spec).get("GPUSHARE_METRICS_PORT")
    if port is None:
        return None
    package = COMMANDS[argv[0]][0].rsplit(".", 1)[0].removeprefix("gpushare.")
    source = "".join(p.read_text() for p in (SERVICES_SOURCE / package).glob("*.py"))
    assert "GPUSHARE_METRICS_PORT" in source, f"gpushare {argv[0]} ignores GPUSHARE_METRICS_PORT"
    return int(port)


def container_ports(spec: Mapping[str, Any]) -> set[int]:
    ports = {int(str(port)) for port in spec.get("expose", [])}
    for mapping in spec.get("ports", []):
        ports.add(int(str(mapping).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def scrape_targets() -> Iterator[tuple[str, str, int]]:
    config = load_yaml(CONFIG / "prometheus.yml")
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                yield job["job_name"], host, int(port)


def test_scrape_targets_are_services_and_their_ports(
    services: dict[str, dict[str, Any]],
) -> None:
    for job, target, port in scrape_targets():
        host = "prometheus" if target == "localhost" else target
        assert target != "localhost" or job == "prometheus"
        assert host in services, f"{job}: {host} is no compose service"
        assert port in container_ports(services[host]), f"{job}: {host} has no port {port}"
        if services[host]["image"] == GPUSHARE_IMAGE:
            assert metrics_port(services[host]) == port, f"{job}: {host} serves another port"


def test_every_gpushare_metrics_port_is_scraped(services: dict[str, dict[str, Any]]) -> None:
    scraped = {(host, port) for _, host, port in scrape_targets()}
    for name, spec in gpushare_services(services).items():
        port = metrics_port(spec)
        if port:
            assert (name, port) in scraped, f"{name}:{port} is not scraped"
    assert {"allocator", "binder", "otel-collector"} <= {host for host, _ in scraped}


# -- tracing ------------------------------------------------------------------------------


def test_collector_receives_otlp_and_exports_to_tempo(
    services: dict[str, dict[str, Any]],
) -> None:
    collector = load_yaml(CONFIG / "otel-collector.yaml")
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    traces = collector["service"]["pipelines"]["traces"]
    assert "otlp" in traces["receivers"]
    for processor in traces.get("processors", []):
        assert processor in collector["processors"]
    to_tempo = [
        name
        for name in traces["exporters"]
        if name.split("/")[0] == "otlp"
        and collector["exporters"][name]["endpoint"].startswith("tempo:")
    ]
    assert to_tempo, "no traces pipeline exports to tempo"
    tempo = load_yaml(CONFIG / "tempo.yaml")
    grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert collector["exporters"][to_tempo[0]]["endpoint"].rsplit(":", 1)[1] == grpc.rsplit(":")[1]
    assert "tempo" in services["otel-collector"]["depends_on"]


def test_services_send_traces_to_the_collector(services: dict[str, dict[str, Any]]) -> None:
    collector_ports = container_ports(services["otel-collector"])
    for name, spec in gpushare_services(services).items():
        env = environment(spec)
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        host, _, port = endpoint.removeprefix("http://").partition(":")
        assert host == "otel-collector", name
        assert int(port) in collector_ports, name
        assert env["OTEL_TRACES_EXPORTER"] == "otlp", name
        assert env["OTEL_SERVICE_NAME"].startswith("gpushare-"), name
    assert environment(services["allocator"])["OTEL_SERVICE_NAME"] == "gpushare-allocator"


# -- metric names the services export -----------------------------------------------------

SUFFIXES = {
    "Counter": ("_total", "_created"),
    "CounterMetricFamily": ("_total", "_created"),
    "Gauge": ("",),
    "GaugeMetricFamily": ("",),
    "Histogram": ("_bucket", "_count", "_sum", "_created"),
    "HistogramMetricFamily": ("_bucket", "_count", "_sum"),
    "Summary": ("", "_count", "_sum", "_created"),
    "SummaryMetricFamily": ("_count", "_sum"),
    "Info": ("_info",),
    "InfoMetricFamily": ("_info",),
    "Enum": ("",),
    "StateSetMetricFamily": ("",),
}
WILDCARD = "[a-zA-Z0-9_]+"


@dataclass(frozen=True)
class Exported:
    pattern: re.Pattern[str]
    labels: frozenset[str] | None
    """None: not known from the source (label checks are skipped for it)."""


class Bindings(ast.NodeVisitor):
    """Module constants and ``self.x = ...`` assignments, to resolve f-string metric names."""

    def __init__(self) -> None:
        self.values: dict[str, ast.expr] = {}

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            key = ast.unparse(target)
            if isinstance(target, ast.Name | ast.Attribute):
                self.values.setdefault(key, node.value)
        self.generic_visit(node)


def name_pattern(node: ast.expr, bindings: Mapping[str, ast.expr], depth: int = 0) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(name_pattern(part, bindings, depth) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        return name_pattern(node.value, bindings, depth)
    bound = bindings.get(ast.unparse(node))
    if bound is not None and depth < 5:
        return name_pattern(bound, bindings, depth + 1)
    return WILDCARD


def label_names(node: ast.expr | None, bindings: Mapping[str, ast.expr]) -> frozenset[str] | None:
    if node is None:
        return frozenset()
    if isinstance(node, ast.Name) and node.id in bindings:
        node = bindings[node.id]
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(item, ast.Constant) and isinstance(item.value, str) for item in node.elts
    ):
        return frozenset(item.value for item in node.elts)  # type: ignore[attr-defined]
    return None


def metrics_in(path: Path) -> Iterator[Exported]:
    text = path.read_text()
    if "prometheus_client" not in text:
        return
    tree = ast.parse(text)
    bindings = Bindings()
    bindings.visit(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kind = ast.unparse(node.func).rsplit(".", 1)[-1]
        if kind not in SUFFIXES:
            continue
        keywords = {keyword.arg: keyword.value for keyword in node.keywords}
        name = node.args[0] if node.args else keywords.get("name")
        if not isinstance(name, ast.Constant | ast.JoinedStr):
            continue  # not a metric (collections.Counter and the like)
        base = name_pattern(name, bindings.values)
        if "Counter" in kind:
            base = base.removesuffix("_total")
        # Counter(name, doc, labelnames), GaugeMetricFamily(name, doc, value, labels)
        position = 3 if kind.endswith("MetricFamily") else 2
        labels_node = node.args[position] if len(node.args) > position else None
        labels_node = keywords.get("labelnames", keywords.get("labels", labels_node))
        labels = label_names(labels_node, bindings.values)
        for suffix in SUFFIXES[kind]:
            pattern = re.compile(base + re.escape(suffix))
            yield Exported(pattern, labels)


@pytest.fixture(scope="module")
def exported() -> list[Exported]:
    found = [m for path in sorted(SERVICES_SOURCE.rglob("*.py")) for m in metrics_in(path)]
    # rendered as text by the allocator itself (a scrape of 10,000 nodes must be cheap)
    found += [Exported(re.compile(re.escape(g.name)), frozenset(LABELS)) for g in GAUGES]
    assert any(m.pattern.fullmatch("gpushare_extender_request_seconds_bucket") for m in found)
    return found


def test_metric_names_are_found_in_the_source(exported: list[Exported]) -> None:
    def known(name: str) -> bool:
        return any(m.pattern.fullmatch(name) for m in exported)

    assert known("gpushare_bind_outcomes_total")
    assert known("gpushare_node_agent_allocations_total")
    assert not known("gpushare_bind_outcomes")
    assert not known("gpushare_no_such_metric_total")


# -- Grafana ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasources() -> dict[str, str]:
    """uid -> type of every provisioned data source."""
    found: dict[str, str] = {}
    for path in sorted(DATASOURCES.glob("*.y*ml")):
        for source in load_yaml(path)["datasources"]:
            found[source["uid"]] = source["type"]
    assert {"prometheus", "tempo"} <= set(found.values())
    return found


@pytest.fixture(scope="module")
def dashboards() -> list[dict[str, Any]]:
    paths = sorted(DASHBOARDS.glob("*.json"))
    assert paths
    return [json.loads(path.read_text()) for path in paths]


def panels_of(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_datasources_point_at_compose_services(services: dict[str, dict[str, Any]]) -> None:
    for path in sorted(DATASOURCES.glob("*.y*ml")):
        for source in load_yaml(path)["datasources"]:
            host, _, port = source["url"].removeprefix("http://").partition(":")
            assert host in services, source["name"]
            assert int(port) in container_ports(services[host]), source["name"]


def test_dashboard_provider_reads_the_mounted_dashboards(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = {
        volume.split(":")[1]: volume.split(":")[0] for volume in services["grafana"]["volumes"]
    }
    assert CONFIG.joinpath("grafana", "provisioning").is_dir()
    assert mounts["/etc/grafana/provisioning"] == "./deploy/compose/grafana/provisioning"
    for path in sorted((CONFIG / "grafana" / "provisioning" / "dashboards").glob("*.y*ml")):
        for provider in load_yaml(path)["providers"]:
            source = mounts[provider["options"]["path"]]
            assert (ROOT / source).resolve() == DASHBOARDS.resolve()


def test_dashboard_panels_use_provisioned_datasources(
    dashboards: list[dict[str, Any]], datasources: dict[str, str]
) -> None:
    for dashboard in dashboards:
        assert dashboard["uid"]
        ids = [panel["id"] for panel in panels_of(dashboard)]
        assert len(ids) == len(set(ids)), dashboard["title"]
        sources = [panel.get("datasource") for panel in panels_of(dashboard)]
        sources += [t.get("datasource") for p in panels_of(dashboard) for t in p.get("targets", [])]
        sources += [v.get("datasource") for v in dashboard["templating"]["list"]]
        for source in filter(None, sources):
            assert source["uid"] in datasources, source
            assert datasources[source["uid"]] == source["type"], source


PROMQL_LABELS = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
PROMQL_MATCHERS = re.compile(r"\{([^}]*)\}")
STANDARD_LABELS = {"job", "instance"}


def promql_exprs(dashboards: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for dashboard in dashboards:
        for panel in panels_of(dashboard):
            for target in panel.get("targets", []):
                if "expr" in target:
                    yield panel["title"], target["expr"]
        for variable in dashboard["templating"]["list"]:
            if variable.get("type") == "query":
                yield f"${variable['name']}", variable["definition"]


def promql_problems(expr: str, exported: list[Exported]) -> list[str]:
    """Metric names no service exports, and labels none of the expression's metrics has."""
    names = set(re.findall(r"\bgpushare_[a-zA-Z0-9_]+", expr))
    if not names and not re.search(r"\bup\{", expr):
        return ["uses no gpushare metric"]
    problems: list[str] = []
    allowed = set(STANDARD_LABELS)
    for name in sorted(names):
        matches = [m for m in exported if m.pattern.fullmatch(name)]
        if not matches:
            problems.append(f"no service exports {name}")
        for match in matches:
            allowed |= match.labels if match.labels is not None else {"*"}
        if name.endswith("_bucket"):
            allowed.add("le")
    if "*" in allowed:
        return problems
    used = {label.strip() for group in PROMQL_LABELS.findall(expr) for label in group.split(",")}
    for group in PROMQL_MATCHERS.findall(expr):
        used |= {part.split("=")[0].strip(" !~") for part in group.split(",") if part.strip()}
    used |= set(re.findall(r"label_values\([^,]+,\s*(\w+)\)", expr))
    used.discard("")
    problems += [f"no label {label}" for label in sorted(used - allowed)]
    return problems


def test_dashboard_queries_use_exported_metrics_and_labels(
    dashboards: list[dict[str, Any]], exported: list[Exported]
) -> None:
    for title, expr in promql_exprs(dashboards):
        assert not promql_problems(expr, exported), f"{title}: {expr}"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(gpushare_bind_outcome_total[5m]))", "no service exports"),
        ("sum by (reason) (rate(gpushare_filter_failed_nodes_total[5m]))", "no label reason"),
        ('gpushare_allocator_card_free_memory_mib{gpu="0"}', "no label gpu"),
        ("sum(rate(http_requests_total[5m]))", "uses no gpushare metric"),
    ],
)
def test_the_query_check_catches_mistakes(
    expr: str, problem: str, exported: list[Exported]
) -> None:
    assert any(problem in found for found in promql_problems(expr, exported))


def test_dashboard_has_the_panels_asked_for(dashboards: list[dict[str, Any]]) -> None:
    exprs = " ".join(expr for _, expr in promql_exprs(dashboards))
    for wanted in (
        "gpushare_allocator_card_allocated_memory_mib",
        "gpushare_allocator_card_free_memory_mib",
        "gpushare_extender_request_seconds_bucket",
        "gpushare_filter_failed_nodes_total",
        "gpushare_bind_outcomes_total",
        "_log_lag_events",
    ):
        assert wanted in exprs, wanted
    assert "histogram_quantile(0.99" in exprs
    assert "histogram_quantile(0.5" in exprs


def test_trace_search_panel_finds_the_allocator(
    dashboards: list[dict[str, Any]],
    datasources: dict[str, str],
    services: dict[str, dict[str, Any]],
) -> None:
    service = environment(services["allocator"])["OTEL_SERVICE_NAME"]
    searches = [
        target["query"]
        for dashboard in dashboards
        for panel in panels_of(dashboard)
        for target in panel.get("targets", [])
        if datasources.get(target.get("datasource", {}).get("uid", "")) == "tempo"
    ]
    assert any(f'"{service}"' in query for query in searches), searches
