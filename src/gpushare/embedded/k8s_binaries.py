"""Finding the real Kubernetes binaries the real-cluster harness runs.

kube-apiserver, kube-scheduler, kube-controller-manager and kubelet come from one
directory: ``--k8s-bin DIR``, else ``$GPUSHARE_K8S_BIN_DIR``, else
``~/.cache/gpushare/k8s`` (where ``make k8s-bin`` builds them). etcd, containerd, runc,
ctr and busybox come from the system (``src/gpushare/embedded/k8s/install.sh --kubelet``
installs Debian's). :meth:`K8sBinaries.find` says in one line what is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_BIN_DIR = "GPUSHARE_K8S_BIN_DIR"
DEFAULT_BIN_DIR = Path("~/.cache/gpushare/k8s")
CONTROL_PLANE = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
KUBELET_TOOLS = ("containerd", "ctr", "runc")
BUSYBOX = Path("/bin/busybox")
HOW_TO_GET = "run `make k8s-bin`, or point GPUSHARE_K8S_BIN_DIR (or --k8s-bin) at release binaries"


class K8sBinariesMissing(RuntimeError):
    """What is missing, in one line, and how to get it."""

    def __init__(self, directory: Path, missing: list[str]) -> None:
        self.directory = directory
        self.missing = tuple(missing)
        super().__init__(f"no {', '.join(missing)} for {directory} ({HOW_TO_GET})")


def bin_dir(explicit: Path | str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the binaries are looked for: ``explicit``, ``$GPUSHARE_K8S_BIN_DIR``, the default."""
    environ = os.environ if env is None else env
    chosen = explicit or environ.get(ENV_BIN_DIR) or DEFAULT_BIN_DIR
    return Path(chosen).expanduser().resolve()


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@dataclass(frozen=True)
class K8sBinaries:
    """Paths of every program the harness runs; only made by :meth:`find`."""

    directory: Path
    etcd: Path
    kubelet: bool
    """Whether the kubelet and its container runtime were checked too (real nodes)."""

    @property
    def version(self) -> str | None:
        """The ``VERSION`` file ``make k8s-bin`` writes (release binaries have none)."""
        path = self.directory / "VERSION"
        return path.read_text().strip() if path.exists() else None

    def path(self, name: str) -> Path:
        return self.directory / name

    @classmethod
    def find(
        cls,
        explicit: Path | str | None = None,
        *,
        kubelet: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> K8sBinaries:
        """The binaries for a control plane (and, with ``kubelet``, real nodes).

        Raises :class:`K8sBinariesMissing` naming everything that is missing.
        """
        environ = os.environ if env is None else env
        directory = bin_dir(explicit, environ)
        missing = [name for name in CONTROL_PLANE if not _executable(directory / name)]
        etcd = _find_etcd(directory, environ)
        if etcd is None:
            missing.append("etcd (apt-get install etcd-server)")
        if kubelet:
            missing += _kubelet_missing(directory)
        if missing:
            raise K8sBinariesMissing(directory, missing)
        assert etcd is not None
        return cls(directory=directory, etcd=etcd, kubelet=kubelet)


def _find_etcd(directory: Path, env: Mapping[str, str]) -> Path | None:
    candidates = [env.get("ETCD_BIN"), shutil.which("etcd"), str(directory / "etcd")]
    for candidate in candidates:
        if candidate and _executable(Path(candidate)):
            return Path(candidate)
    return None


def _kubelet_missing(directory: Path) -> list[str]:
    missing = [] if _executable(directory / "kubelet") else ["kubelet"]
    tools = [tool for tool in KUBELET_TOOLS if shutil.which(tool) is None]
    if not _executable(BUSYBOX):
        tools.append("busybox")
    if tools:
        missing.append(f"{', '.join(tools)} (install.sh --kubelet: containerd runc busybox-static)")
    if os.geteuid() != 0:
        missing.append("root (a real kubelet mounts, makes cgroups and runs containers)")
    return missing
