"""The Kubernetes API calls each service makes, read from its source: the RBAC it needs.

Every call to the API goes through ``gpushare.kube`` and the official client's
``CoreV1Api``, ``CustomObjectsApi`` or ``ResourceV1Api``. This module parses (``ast``) the
functions of
``src/gpushare/kube/*.py``, finds the client methods each one names (``kube.core.
patch_node``, ``_api(kube).list_cluster_custom_object``: any attribute that is a method
of those classes, or a string naming one: the ``name`` of ``KubeClient.request``) and
the other ``gpushare.kube`` functions it refers to, then follows
them from what a service's package names. Each client method becomes the
(API group, resource, verb) it needs, from the client's naming scheme (``read_`` is
``get``, ``replace_`` is ``update``, a ``_status`` or ``_binding`` suffix a subresource);
a ``list_`` called with ``watch=True`` needs ``watch`` as well, a server-side apply
(``patch_`` with the apply content type) ``create`` as well, and a raw
request (aiohttp) to a collection's path with a ``watch`` parameter. A custom-object
method's group and plural are its first and third arguments, resolved through the
module's imports (``gpushare.core.devices.GROUP``). The service's own modules are scanned
the same way, for a call made without ``gpushare.kube``.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kubernetes import client

SRC = Path(__file__).resolve().parents[2] / "src" / "gpushare"
KUBE = SRC / "kube"
APIS = (client.CoreV1Api, client.CustomObjectsApi, client.ResourceV1Api)
APPLY = "application/apply-patch+yaml"
"""A server-side apply: authorized as ``patch``, and as ``create`` when the object is new."""

CLIENT_HELPERS = frozenset({"close"})
"""Methods of the API classes that call no API (closing the connection pool)."""

Grant = tuple[str, str, str]
"""(API group, resource, verb)."""

VERBS = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
METHOD = re.compile(
    r"^(?P<verb>read|get|list|create|patch|replace|delete)_"
    r"(?:namespaced_|cluster_)?(?P<kind>[a-z_]+?)"
    r"(?:_(?P<sub>status|binding))?(?:_for_all_namespaces)?$"
)


def api_method(name: str) -> bool:
    """Whether ``name`` is an API call of the client (not one of its helpers)."""
    return (
        not name.startswith("_")
        and name not in CLIENT_HELPERS
        and not name.endswith("_with_http_info")
        and any(callable(vars(api).get(name)) for api in APIS)
    )


def grants_of(
    method: str, watch: bool = False, custom: tuple[str, str] | None = None
) -> set[Grant]:
    """What calling the client method ``method`` needs; ``custom`` is the (group, plural)
    a custom-object method is called with."""
    match = METHOD.match(method)
    if match is None:
        raise AssertionError(f"no RBAC mapping for the client method {method!r}")
    kind = match["kind"]
    if kind == "custom_object":
        if custom is None:
            raise AssertionError(f"{method}: the group and plural it is called with are unknown")
        group, resource = custom
    elif hasattr(client.CoreV1Api, method):
        group, resource = "", f"{kind}s"
    elif hasattr(client.ResourceV1Api, method):
        group, resource = "resource.k8s.io", f"{kind.replace('_', '')}s"
    else:
        raise AssertionError(f"no RBAC mapping for the client method {method!r}")
    if match["sub"]:
        resource = f"{resource}/{match['sub']}"
    verb = VERBS[match["verb"]]
    found = {(group, resource, verb)}
    if watch:
        found.add((group, resource, "watch"))
    return found


@dataclass
class Function:
    """One function or method of ``gpushare.kube``: the API calls and names in it."""

    module: str
    name: str
    calls: set[Grant] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)


def _watching(node: ast.AST, attribute: ast.Attribute) -> bool:
    """Whether ``attribute`` is called with ``watch=True`` anywhere inside ``node``."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and call.func is attribute:
            for keyword in call.keywords:
                if keyword.arg == "watch" and isinstance(keyword.value, ast.Constant):
                    return bool(keyword.value.value)
    return False


RAW_PATH = re.compile(
    r"^/api/v1/(?P<resource>[a-z]+)$|^/apis/(?P<group>[a-z0-9.]+)/[a-z0-9]+/(?P<custom>[a-z]+)$"
)
"""A path a function requests without the client (a whole collection, cluster-wide)."""


def _raw_calls(node: ast.AST) -> set[Grant]:
    """The grants of the raw requests in ``node`` (aiohttp): a watch (a ``watch``
    parameter, or ``watch_raw`` of the path), a list (``list_raw`` of the path), or an
    ``Informer`` of the path (list and watch); any other raw path fails, to be mapped
    here before it can go unnoticed."""
    constants = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    informer = "Informer" in names
    watches = informer or "watch" in constants or "watch_raw" in names
    lists = informer or "list_raw" in names
    grants: set[Grant] = set()
    for value in constants:
        if not isinstance(value, str) or not (match := RAW_PATH.match(value)):
            continue
        if not watches and not lists:
            raise AssertionError(f"a raw request to {value}: map its verb in {__name__}")
        group, resource = match["group"] or "", match["resource"] or match["custom"]
        if watches:
            grants.add((group, resource, "watch"))
        if lists:
            grants.add((group, resource, "list"))
    return grants


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> ``module:attribute`` of each ``from ... import`` of the module."""
    return {
        alias.asname or alias.name: f"{statement.module}:{alias.name}"
        for statement in ast.walk(tree)
        if isinstance(statement, ast.ImportFrom) and statement.module
        for alias in statement.names
    }


def _value(argument: ast.expr, imports: dict[str, str]) -> str:
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return argument.value
    if isinstance(argument, ast.Name) and argument.id in imports:
        module, attribute = imports[argument.id].split(":")
        return str(getattr(importlib.import_module(module), attribute))
    raise AssertionError(f"cannot resolve {ast.unparse(argument)} statically")


def _custom(node: ast.AST, attribute: ast.Attribute, imports: dict[str, str]) -> tuple[str, str]:
    """The (group, plural) a custom-object method is called with, called directly or
    handed to ``kube.call`` with its arguments: ``(GROUP, VERSION, PLURAL, ...)``."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        if call.func is attribute:
            arguments = call.args
        elif attribute in call.args:
            arguments = call.args[call.args.index(attribute) + 1 :]
        else:
            continue
        return _value(arguments[0], imports), _value(arguments[2], imports)
    raise AssertionError(f"{attribute.attr} is named but never called")


def _scan(module: str, node: ast.AST, name: str, imports: dict[str, str]) -> Function:
    function = Function(module, name, calls=_raw_calls(node))
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute):
            function.names.add(child.attr)
            if api_method(child.attr):
                function.methods.add(child.attr)
                custom = _custom(node, child, imports) if "custom_object" in child.attr else None
                function.calls |= grants_of(child.attr, _watching(node, child), custom)
        elif isinstance(child, ast.Name):
            function.names.add(child.id)
        elif (
            isinstance(child, ast.Constant)
            and isinstance(child.value, str)
            and api_method(child.value)
        ):  # KubeClient.request("create_namespaced_pod_binding", ...): named by the method
            function.methods.add(child.value)
            function.calls |= grants_of(child.value)
    if any(isinstance(c, ast.Constant) and c.value == APPLY for c in ast.walk(node)):
        function.calls |= {(g, r, "create") for g, r, verb in function.calls if verb == "patch"}
    return function


def _definitions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Top-level functions, and every class as one unit (its methods together)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node


@cache
def kube_functions() -> dict[str, tuple[Function, ...]]:
    """Every function and class of ``gpushare.kube``, by name."""
    found: dict[str, list[Function]] = {}
    for path in sorted(KUBE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imports = _imports(tree)
        for name, node in _definitions(tree):
            found.setdefault(name, []).append(_scan(path.stem, node, name, imports))
    return {name: tuple(functions) for name, functions in found.items()}


def _imported_from_kube(paths: Iterable[Path]) -> set[str]:
    """The names ``paths`` import from ``gpushare.kube.*`` (at any depth of the file)."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "gpushare.kube."
            ):
                names |= {alias.name for alias in node.names}
    return names


def reached(roots: Iterable[str]) -> set[str]:
    """The ``gpushare.kube`` functions and classes ``roots`` lead to."""
    functions = kube_functions()
    seen: set[str] = set()
    todo = [name for name in roots if name in functions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for function in functions[name]:
            todo += [n for n in function.names if n in functions and n not in seen]
    return seen


def _direct_calls(package: str) -> set[Grant]:
    """API calls the service's own modules make, without ``gpushare.kube``."""
    grants: set[Grant] = set()
    for path in sorted((SRC / package).glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        grants |= _scan(path.stem, tree, path.stem, _imports(tree)).calls
    return grants


def service_calls(package: str) -> set[Grant]:
    """Everything the service in ``src/gpushare/<package>`` needs of the API."""
    roots = _imported_from_kube(sorted((SRC / package).glob("*.py")))
    functions = kube_functions()
    grants: set[Grant] = _direct_calls(package)
    for name in reached(roots):
        for function in functions[name]:
            grants |= function.calls
    return grants


def service_methods(package: str) -> set[str]:
    """The client methods the service calls (for messages and sanity checks)."""
    roots = _imported_from_kube(sorted((SRC / package).glob("*.py")))
    functions = kube_functions()
    return {m for name in reached(roots) for f in functions[name] for m in f.methods}
