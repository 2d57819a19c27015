"""The Dockerfile, checked without a Docker engine: it parses into known instructions,
builds in two stages from a pinned Python image, installs with the constraints, runs
as a non-root user with ``gpushare`` as its entry point, and copies only files that
exist and that .dockerignore lets through."""

from __future__ import annotations

import json
import re
import tomllib

from tests.deploy.manifests import ROOT

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
    "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
PINNED_PYTHON = re.compile(r"^python:3\.11\.\d+-slim(?:-[a-z]+)?$")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    parsed = []
    for line in lines:
        keyword, _, arguments = line.partition(" ")
        assert keyword.upper() in INSTRUCTIONS, f"unknown instruction: {line}"
        parsed.append((keyword.upper(), arguments.strip()))
    return parsed


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            found.append([])
        assert found, "an instruction before the first FROM"
        found[-1].append(instruction)
    return found


def test_builds_in_stages_from_a_pinned_python_image() -> None:
    built = stages()
    assert len(built) >= 2
    for stage in built:
        image = stage[0][1].split()[0]
        assert PINNED_PYTHON.match(image), image
    final = built[-1]
    copies = [args for keyword, args in final if keyword == "COPY"]
    assert any(args.startswith("--from=build ") for args in copies)
    assert all(args.startswith("--from=") for args in copies), "final stage copies sources"


def test_installs_the_package_with_the_constraints() -> None:
    runs = [args for keyword, args in instructions() if keyword == "RUN"]
    installs = [run for run in runs if "pip install" in run]
    assert len(installs) == 1
    assert re.search(r"pip install (?:.* )?-c constraints\.txt \.$", installs[0]), installs[0]


def test_runs_as_non_root_with_the_gpushare_entry_point() -> None:
    final = stages()[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    [entrypoint] = [args for keyword, args in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["gpushare"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "gpushare" in scripts


def test_copied_sources_exist_and_pass_dockerignore() -> None:
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "**", "ignore everything, then let the sources through"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = []
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from="):
            *copied, _destination = args.split()
            sources += copied
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {project["project"]["readme"], "pyproject.toml", "constraints.txt"}
    needed |= set(project["tool"]["setuptools"]["package-dir"].values())
    assert needed <= {source.rstrip("/") for source in sources}
