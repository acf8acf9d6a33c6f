"""Where the local control plane's binaries are: versions, cache folder, one path per tool.

What it owns: reading the pinned versions from ``tools/testenv/versions.sh`` (the single source the
build script also sources), the cache folder (``$TANDEM_TESTENV_CACHE``, default
``~/.cache/tandem-testenv``) and the absolute path of every binary the cluster tier needs, plus the
Prometheus server from the Debian package.

What it must not do: build, download or install anything (``make testenv`` does that). It only looks.

Invariants: every path it returns is absolute (kwokctl treats a non-URL path as local and never
downloads it); a missing binary is reported with the command that builds it, never silently replaced
by whatever happens to be on ``PATH`` (the one deliberate fallback is ``kubectl``, see ``locate``).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

CACHE_ENV = "TANDEM_TESTENV_CACHE"
PROMETHEUS_ENV = "TANDEM_PROMETHEUS_BIN"
REPO_ROOT_ENV = "TANDEM_REPO_ROOT"
DEFAULT_CACHE = Path("~/.cache/tandem-testenv")
DEFAULT_PROMETHEUS = Path("/usr/bin/prometheus")
VERSIONS_FILE = Path("tools/testenv/versions.sh")
BUILD_HINT = "run `make testenv` (tools/testenv/build.sh + tools/testenv/prometheus.sh)"

# Used only when the package runs outside a checkout (no versions.sh to read); a unit test keeps these
# equal to tools/testenv/versions.sh.
DEFAULT_VERSIONS: dict[str, str] = {
    "K8S_VERSION": "v1.34.4",
    "ETCD_VERSION": "v3.6.14",
    "KWOK_VERSION": "v0.8.0",
    "HELM_VERSION": "v3.21.4",
}

_ASSIGNMENT = re.compile(r"^\s*([A-Z][A-Z0-9_]*)=([^\s#]+)\s*(?:#.*)?$")


class TestenvError(RuntimeError):
    """A binary the local cluster needs is missing; the message says how to build it."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class Versions:
    """The pinned component versions (tags with a leading ``v``)."""

    k8s: str
    etcd: str
    kwok: str
    helm: str


@dataclass(frozen=True)
class Toolchain:
    """Absolute paths of every tool the local cluster tier uses."""

    cache_dir: Path
    versions: Versions
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path
    kwokctl: Path
    helm: Path
    prometheus: Path

    def binaries(self) -> dict[str, Path]:
        """Tool name -> path, for every binary (not the cache folder or versions)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("cache_dir", "versions")}

    def missing(self, names: tuple[str, ...] | None = None) -> list[str]:
        """Names of the binaries (all, or just ``names``) that are not executable files."""
        wanted = self.binaries() if names is None else {n: self.binaries()[n] for n in names}
        return [name for name, path in wanted.items() if not _is_executable(path)]

    def require(self, names: tuple[str, ...] | None = None) -> Toolchain:
        """Return self, or raise ``TestenvError`` naming every missing binary and the fix."""
        missing = self.missing(names)
        if missing:
            lines = [f"  {name}: {self.binaries()[name]}" for name in missing]
            raise TestenvError("local control plane binaries missing:\n" + "\n".join(lines) + f"\n{BUILD_HINT}")
        return self


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def parse_versions(text: str) -> Versions:
    """Parse ``KEY=value`` lines of versions.sh (comments and blank lines ignored).

    >>> parse_versions("K8S_VERSION=v1.34.4\\nETCD_VERSION=v3.6.14\\nKWOK_VERSION=v0.8.0\\nHELM_VERSION=v3.21.4").kwok
    'v0.8.0'
    """
    values = dict(DEFAULT_VERSIONS)
    found: set[str] = set()
    for line in text.splitlines():
        match = _ASSIGNMENT.match(line)
        if match and match.group(1) in values:
            values[match.group(1)] = match.group(2).strip("'\"")
            found.add(match.group(1))
    absent = sorted(set(DEFAULT_VERSIONS) - found)
    if absent:
        raise ValueError(f"versions.sh lacks {', '.join(absent)}")
    return Versions(
        k8s=values["K8S_VERSION"],
        etcd=values["ETCD_VERSION"],
        kwok=values["KWOK_VERSION"],
        helm=values["HELM_VERSION"],
    )


def repo_root() -> Path | None:
    """The checkout this package runs from (``$TANDEM_REPO_ROOT`` first), or None outside one."""
    env = os.environ.get(REPO_ROOT_ENV)
    if env:
        return Path(env).expanduser().resolve()
    for parent in Path(__file__).resolve().parents:
        if (parent / VERSIONS_FILE).is_file():
            return parent
    return None


def load_versions(root: Path | None = None) -> Versions:
    """Versions from the checkout's versions.sh, or the built-in defaults outside a checkout."""
    root = root if root is not None else repo_root()
    if root is not None and (root / VERSIONS_FILE).is_file():
        return parse_versions((root / VERSIONS_FILE).read_text())
    return parse_versions("\n".join(f"{k}={v}" for k, v in DEFAULT_VERSIONS.items()))


def cache_dir() -> Path:
    """``$TANDEM_TESTENV_CACHE`` or ``~/.cache/tandem-testenv``, absolute."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser().resolve()


def locate(cache: Path | None = None, versions: Versions | None = None) -> Toolchain:
    """Compute every tool's path. Nothing is checked here: call ``require()`` for that.

    kubectl: the one built with Kubernetes (exact version match). Only when that is missing does it
    fall back to a ``kubectl`` on PATH, so a half-built cache still gives a usable client.
    Prometheus: ``$TANDEM_PROMETHEUS_BIN``, else /usr/bin/prometheus (Debian package), else PATH.
    """
    cache = (cache or cache_dir()).expanduser().resolve()
    versions = versions or load_versions()
    k8s = cache / f"k8s-{versions.k8s}"
    kwok = cache / f"kwok-{versions.kwok}"
    kubectl = k8s / "kubectl"
    if not _is_executable(kubectl):
        found = shutil.which("kubectl")
        if found:
            kubectl = Path(found).resolve()
    prometheus = Path(os.environ.get(PROMETHEUS_ENV) or DEFAULT_PROMETHEUS)
    if not _is_executable(prometheus) and PROMETHEUS_ENV not in os.environ:
        found = shutil.which("prometheus")
        if found:
            prometheus = Path(found).resolve()
    return Toolchain(
        cache_dir=cache,
        versions=versions,
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kubectl=kubectl,
        etcd=cache / f"etcd-{versions.etcd}" / "etcd",
        kwok=kwok / "kwok",
        kwokctl=kwok / "kwokctl",
        helm=cache / f"helm-{versions.helm}" / "helm",
        prometheus=prometheus.expanduser().absolute(),
    )


# The binaries `tandem dev cluster up` cannot run without (Helm is only for chart tests).
CLUSTER_BINARIES: tuple[str, ...] = (
    "kube_apiserver",
    "kube_controller_manager",
    "kube_scheduler",
    "kubectl",
    "etcd",
    "kwok",
    "kwokctl",
)
