"""Rendering the Tandem Helm chart for tests, and reading what it rendered.

What it owns: the chart's paths, running the pinned Helm (from the testenv cache, never ``PATH``) with a
kubeconfig that points nowhere for offline commands (``helm template`` must never reach a real cluster),
a cached ``render`` that returns parsed objects, and small accessors (pod specs, containers, RBAC rules).

What it must not do: install anything. Cluster installs live in ``tests/cluster/chart_fixtures.py``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tandem_lab.dev.testenv import locate

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tandem"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CRDS = REPO / "crds"
CHART_CRDS = CHART / "files" / "crds"
KUBE_VERSION = "v1.34.4"
RELEASE = "tandem"
RELEASE_NAMESPACE = "tandem-system"
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:tandem"
TEST_DIGEST = "sha256:" + "0123456789abcdef" * 4
MINIMAL_VALUES = CHART / "ci" / "minimal-values.yaml"
FULL_VALUES = CHART / "ci" / "full-values.yaml"

Obj = dict[str, Any]


class HelmError(RuntimeError):
    """Helm exited non-zero; ``output`` has its stderr and stdout."""

    def __init__(self, args: Sequence[str], returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output
        super().__init__(f"helm {' '.join(args)} failed ({returncode}):\n{output.strip()}")


@functools.cache
def helm_binary() -> Path:
    """The pinned Helm of the testenv cache (``make testenv`` builds it); an error names the fix."""
    toolchain = locate()
    toolchain.require(("helm",))
    return toolchain.helm


def run_helm(
    *args: str, kubeconfig: Path | None = None, check: bool = True, timeout_s: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """Run Helm. Without ``kubeconfig`` it gets one that does not exist, so it can reach no cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    env["KUBECONFIG"] = str(kubeconfig) if kubeconfig else "/nonexistent/tandem-offline-kubeconfig"
    env["HELM_CACHE_HOME"] = env["HELM_CONFIG_HOME"] = env["HELM_DATA_HOME"] = str(Path("/tmp") / "tandem-helm-home")
    cmd = [str(helm_binary()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if check and proc.returncode != 0:
        raise HelmError(args, proc.returncode, proc.stderr + proc.stdout)
    return proc


def template_args(
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, Any] | None = None,
    namespace: str = RELEASE_NAMESPACE,
    release: str = RELEASE,
) -> list[str]:
    """Arguments of ``helm template`` for the chart (values passed as JSON through ``--set-json``)."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for path in values_files:
        args += ["--values", str(path)]
    for key, value in (set_values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def render_text(
    values_files: Sequence[Path] = (),
    set_values: Mapping[str, Any] | None = None,
    namespace: str = RELEASE_NAMESPACE,
    release: str = RELEASE,
    extra_args: Sequence[str] = (),
) -> str:
    """The rendered manifest as text; ``HelmError`` when the chart refuses the values."""
    args = template_args(values_files, set_values, namespace, release) + list(extra_args)
    return run_helm(*args).stdout


@functools.cache
def _render_cached(values_files: tuple[Path, ...], set_json: str, namespace: str) -> tuple[Obj, ...]:
    text = render_text(values_files, json.loads(set_json), namespace)
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


def render(
    values_files: Sequence[Path] = (MINIMAL_VALUES,),
    set_values: Mapping[str, Any] | None = None,
    namespace: str = RELEASE_NAMESPACE,
) -> list[Obj]:
    """Parsed objects of a render (cached per arguments; callers must not mutate them)."""
    return list(_render_cached(tuple(values_files), json.dumps(set_values or {}, sort_keys=True), namespace))


def of_kind(objects: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(objects: Sequence[Obj]) -> Iterator[tuple[str, Obj]]:
    """(``Kind/name``, pod spec) of every workload in a render (Pods, pod templates, Job templates)."""
    for obj in objects:
        kind, spec = obj.get("kind"), obj.get("spec") or {}
        name = f"{kind}/{obj.get('metadata', {}).get('name')}"
        if kind == "Pod":
            yield name, spec
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield name, spec["template"]["spec"]
        elif kind == "CronJob":
            yield name, spec["jobTemplate"]["spec"]["template"]["spec"]


def containers(pod_spec: Obj) -> list[Obj]:
    """Every container of a pod spec, init and ephemeral ones included."""
    return [
        *pod_spec.get("containers", []),
        *pod_spec.get("initContainers", []),
        *pod_spec.get("ephemeralContainers", []),
    ]


def rbac_rules(objects: Sequence[Obj]) -> Iterator[tuple[str, Obj]]:
    """(``Kind/name``, rule) of every Role and ClusterRole rule."""
    for obj in objects:
        if obj.get("kind") in ("Role", "ClusterRole"):
            for rule in obj.get("rules") or []:
                yield f"{obj['kind']}/{obj['metadata']['name']}", rule


def annotation_line(path: Path, key: str) -> str | None:
    """The value of a ``# key: value`` header comment in a fixture file."""
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    return None


# --- engine scrape configuration (templates/enginescrape.yaml) ----------------------------------------

ENGINE_SCRAPE_VALUES: Mapping[str, Any] = {
    "metrics.enginePodMonitor.enabled": True,
    "metrics.engineScrapeConfig.enabled": True,
}
ENGINE_SCRAPE_CONFIGMAP_KEY = "tandem-engines.yaml"
_SD_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def engine_scrape_job(objects: Sequence[Obj]) -> Obj:
    """The plain Prometheus job of the ``<fullname>-engine-scrape-config`` ConfigMap, parsed."""
    configmaps = of_kind(objects, "ConfigMap")
    configmap = next(o for o in configmaps if o["metadata"]["name"].endswith("-engine-scrape-config"))
    jobs: list[Obj] = yaml.safe_load(configmap["data"][ENGINE_SCRAPE_CONFIGMAP_KEY])["scrape_configs"]
    assert len(jobs) == 1, jobs
    return jobs[0]


def pod_sd_targets(pod: Obj, pod_ip: str = "10.0.0.7") -> list[dict[str, str]]:
    """The targets Prometheus's Kubernetes SD (``role: pod``) discovers for ``pod``: one per container
    port, with the ``__meta_kubernetes_*`` labels a relabel rule can read (label names sanitized as
    Prometheus does: every character outside ``[a-zA-Z0-9_]`` becomes ``_``)."""
    meta = pod["metadata"]
    base = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"]}
    for key, value in meta.get("labels", {}).items():
        name = _SD_INVALID.sub("_", key)
        base[f"__meta_kubernetes_pod_label_{name}"] = value
        base[f"__meta_kubernetes_pod_labelpresent_{name}"] = "true"
    targets = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            targets.append(
                base
                | {
                    "__address__": f"{pod_ip}:{port['containerPort']}",
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }
            )
    return targets


def apply_relabel(rules: Sequence[Obj], labels: Mapping[str, str]) -> dict[str, str] | None:
    """The ``keep`` and default ``replace`` subset of Prometheus relabeling, for fast render checks (the
    realengine tier runs the rendered rules through a real Prometheus). ``None``: the target is dropped.
    Any other action or field fails, so a rule this cannot judge is never judged wrongly."""
    out = dict(labels)
    for rule in rules:
        assert set(rule) <= {"action", "source_labels", "regex", "target_label"}, rule
        value = ";".join(out.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule["action"] == "keep":
            if match is None:
                return None
        elif rule["action"] == "replace":
            if match is not None:
                out[rule["target_label"]] = match.group(1)
        else:
            raise AssertionError(f"unsupported relabel action {rule['action']}")
    return {k: v for k, v in out.items() if not k.startswith("__")}
