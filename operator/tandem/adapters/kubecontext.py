"""The command line's view of a cluster: kubeconfig, context and namespace as kubectl resolves them.

What it owns: turning `--kubeconfig`/`--context`/`-n` into a `Target` (kubeconfig path, context,
namespace), the client for it, and the few reads and writes `tandem get|version|rollout` make. Every
failure a user can cause or meet (no kubeconfig, an unknown context, a cluster that is down) becomes a
`ClusterError` whose message is one line that says what to check; the CLI prints it without a traceback.

What it must not do: serve the operator. The operator reaches Kubernetes through `adapters.kube` (async,
fenced by leader election); this is the synchronous, short-timeout client of a person at a terminal or a
CI job, which has no event loop to block.

Resolution, as kubectl does it: the kubeconfig is `--kubeconfig`, else `$KUBECONFIG` (several files
separated by ':' are merged), else `~/.kube/config`; the context is `--context`, else the kubeconfig's
current context; the namespace is `-n`, else that context's namespace, else `default`. Without any
kubeconfig but inside a pod, the pod's service account is used (the namespace is the pod's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tandem import GROUP, VERSION
from tandem.adapters.kube import KubeError, _wrap

DEFAULT_KUBECONFIG = "~/.kube/config"
DEFAULT_NAMESPACE = "default"
IN_CLUSTER = "(in-cluster)"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# A person or a CI job waits seconds, not the operator's minute: connect fast, answer or say why.
CLI_TIMEOUT = (5, 30)  # connect, read (seconds)
POOLS = "inferencepools"
CRD_PLURALS = ("inferencepools", "mooncakecaches")


class ClusterError(Exception):
    """A problem reaching or addressing the cluster; ``str()`` is the one line the CLI prints."""


@dataclass(frozen=True)
class Target:
    """Where a command goes: the kubeconfig it read, the context in it and the namespace."""

    kubeconfig: str
    context: str
    namespace: str


def kubeconfig_path(explicit: str | None = None) -> str:
    """`--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config` (read at call time, not import time)."""
    return explicit or os.environ.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG)


def _exists(path: str) -> bool:
    return any(Path(part).expanduser().is_file() for part in path.split(os.pathsep) if part)


def resolve_target(kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None) -> Target:
    """The target of a command (see the module docstring for the rules); raises `ClusterError`."""
    path = kubeconfig_path(kubeconfig)
    if not _exists(path):
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            pod_ns = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else ""
            return Target(kubeconfig="", context=IN_CLUSTER, namespace=namespace or pod_ns or DEFAULT_NAMESPACE)
        raise ClusterError(f"no kubeconfig at {path}; set --kubeconfig or $KUBECONFIG")
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    except (config.ConfigException, KeyError, TypeError, ValueError, OSError) as exc:
        if context is None:  # no current-context set is a ConfigException (or KeyError) from the loader
            raise ClusterError(f"kubeconfig {path}: no current context ({_first_line(exc)}); pass --context") from None
        contexts, current = _contexts_only(path), None
    name = context or (current or {}).get("name")
    if not name:
        raise ClusterError(f"kubeconfig {path} has no current context; pass --context")
    match = next((c for c in contexts or [] if c.get("name") == name), None)
    if match is None:
        known = ", ".join(sorted(str(c.get("name")) for c in contexts or [])) or "none"
        raise ClusterError(f"context {name!r} not found in {path} (contexts: {known})")
    ns = namespace or (match.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE
    return Target(kubeconfig=path, context=str(name), namespace=str(ns))


def _contexts_only(path: str) -> list[dict[str, Any]]:
    """The contexts of kubeconfig file(s) without a (valid) current context, so `--context` still works."""
    contexts: list[dict[str, Any]] = []
    for part in path.split(os.pathsep):
        file = Path(part).expanduser()
        if not part or not file.is_file():
            continue
        try:
            doc = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ClusterError(f"kubeconfig {file}: {_first_line(exc)}") from None
        contexts += [c for c in doc.get("contexts") or [] if isinstance(c, dict)] if isinstance(doc, dict) else []
    return contexts


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def unreachable_message(server: str, exc: BaseException) -> str:
    """One line for a cluster that does not answer: refused, timed out, unknown host or TLS (pure)."""
    reason = getattr(exc, "reason", None) or exc
    text = f"{type(reason).__name__}: {reason}".lower()
    if "refused" in text:
        why = "connection refused"
    elif "timed out" in text or "timeout" in text:
        why = "timed out"
    elif "name or service not known" in text or "nodename nor servname" in text or "resolution" in text:
        why = "unknown host"
    elif "ssl" in text or "certificate" in text:
        why = "TLS error"
    else:
        why = _first_line(reason) if isinstance(reason, BaseException) else str(reason)
    return f"cannot reach the cluster at {server} ({why}); check --context/--kubeconfig"


class ClusterClient:
    """The CLI's reads and writes, synchronous, with a short timeout and one-line errors."""

    def __init__(self, target: Target) -> None:
        self.target = target
        configuration = client.Configuration()
        try:
            if target.context == IN_CLUSTER:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=target.kubeconfig,
                    context=target.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (config.ConfigException, OSError, KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"context {target.context!r} in {target.kubeconfig}: {_first_line(exc)}") from None
        configuration.retries = 0  # one attempt: a CLI reports a dead cluster at once
        self.server = str(configuration.host)
        self.api_client = client.ApiClient(configuration)
        self.custom = client.CustomObjectsApi(self.api_client)

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        kwargs["_request_timeout"] = CLI_TIMEOUT
        kwargs["_preload_content"] = False
        try:
            response = fn(*args, **kwargs)
        except ApiException as exc:
            raise _wrap(exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(unreachable_message(self.server, exc)) from None
        data = response.data
        result: dict[str, Any] = json.loads(data) if data else {}
        return result

    def get_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The InferencePool, or None when it does not exist; raises `ClusterError`/`KubeError`."""
        try:
            return self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, POOLS, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_pools(self, namespace: str | None) -> list[dict[str, Any]]:
        """The pools of one namespace, or of all namespaces when ``namespace`` is None."""
        if namespace is None:
            data = self._call(self.custom.list_cluster_custom_object, GROUP, VERSION, POOLS)
        else:
            data = self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, POOLS)
        return list(data.get("items") or [])

    def patch_pool(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a pool (the rollout controls: annotations, spec.rollout.paused)."""
        return self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            POOLS,
            name,
            dict(patch),
            _content_type="application/merge-patch+json",
        )

    def server_version(self) -> str:
        """The API server's gitVersion (e.g. v1.34.1)."""
        return str(self._call(client.VersionApi(self.api_client).get_code).get("gitVersion", "unknown"))

    def installed_crds(self) -> list[str]:
        """Which of Tandem's resources the API server serves (discovery: needs no RBAC beyond login)."""
        try:
            data = self._call(self.custom.get_api_resources, GROUP, VERSION)
        except KubeError as exc:
            if exc.status == 404:
                return []
            raise
        served = {str(r.get("name")) for r in data.get("resources") or []}
        return [plural for plural in CRD_PLURALS if plural in served]
