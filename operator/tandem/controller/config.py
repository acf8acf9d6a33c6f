"""``OperatorConfig``: the operator's settings, with every default written once.

Why one place: `tandem run`'s flags, the environment of in-process runners (kopf's KopfRunner in tests)
and the chart all configure the same process; the defaults used to be repeated in each (the pass
concurrency four times in the operator and twice in the chart) and could drift. The flags take their
defaults from :meth:`OperatorConfig.from_env`, which reads the environment over the class defaults, and
the chart passes a flag only when a value is set.

Environment: TANDEM_NAMESPACES, TANDEM_PROMETHEUS_URL, TANDEM_PROMETHEUS_AUTH_DIR, TANDEM_SCRAPE_INTERVAL,
TANDEM_MAX_CONCURRENT_PASSES, TANDEM_ROUTER_SERVICE, TANDEM_ROUTER_URL, TANDEM_ALLOWED_REGISTRIES and
TANDEM_PROMETHEUS_ALLOWED_ADDRESSES (comma lists), KUBECONFIG.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

DEFAULT_SCRAPE_INTERVAL_S: Final = 15.0
"""Prometheus scrape interval of engine metrics (sample freshness and rate windows)."""
DEFAULT_MAX_CONCURRENT_PASSES: Final = 8
"""Pool passes running at once: bounds memory and API load when many pools wake together."""
DEFAULT_ROUTER_PORT: Final = 8000
"""The router Service's client port when only ``--router-service`` is given (the chart's ``router.port``
default; the chart passes ``--router-url`` with its own value)."""


def env_list(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated environment variable as a list (blank items dropped)."""
    env = os.environ if environ is None else environ
    return [v.strip() for v in env.get(name, "").split(",") if v.strip()]


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)
    prometheus_url: str = ""
    prometheus_auth_dir: str = ""
    kubeconfig: str | None = None
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    max_concurrent_passes: int = DEFAULT_MAX_CONCURRENT_PASSES
    allowed_registries: list[str] = field(default_factory=list)
    """Registries snapshot images must come from (the chart passes admissionPolicies.imageRegistries.allowed)."""
    prometheus_allowed_addresses: list[str] = field(default_factory=list)
    """https Prometheus addresses a pool may name and still get the credentials (besides --prometheus-url)."""
    router_service: str = ""
    """``namespace/name`` of the router Service whose replicas report open streams ("" : drains are timers)."""
    router_url: str = ""
    """Where eval Jobs reach the router (``http://host:port``); "" : derived from ``router_service``."""

    def eval_router_url(self) -> str:
        """The router URL eval Jobs call, or "" when no router is configured (they call decode pods then)."""
        if self.router_url:
            return self.router_url.rstrip("/")
        if "/" not in self.router_service:
            return ""
        namespace, name = self.router_service.split("/", 1)
        return f"http://{name}.{namespace}.svc:{DEFAULT_ROUTER_PORT}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        """The class defaults, overridden by whatever the environment sets."""
        env = os.environ if environ is None else environ
        return cls(
            namespaces=env_list("TANDEM_NAMESPACES", env),
            prometheus_url=env.get("TANDEM_PROMETHEUS_URL", ""),
            prometheus_auth_dir=env.get("TANDEM_PROMETHEUS_AUTH_DIR", ""),
            kubeconfig=env.get("KUBECONFIG") or None,
            scrape_interval_s=float(env.get("TANDEM_SCRAPE_INTERVAL") or DEFAULT_SCRAPE_INTERVAL_S),
            max_concurrent_passes=int(env.get("TANDEM_MAX_CONCURRENT_PASSES") or DEFAULT_MAX_CONCURRENT_PASSES),
            allowed_registries=env_list("TANDEM_ALLOWED_REGISTRIES", env),
            prometheus_allowed_addresses=env_list("TANDEM_PROMETHEUS_ALLOWED_ADDRESSES", env),
            router_service=env.get("TANDEM_ROUTER_SERVICE", ""),
            router_url=env.get("TANDEM_ROUTER_URL", ""),
        )
