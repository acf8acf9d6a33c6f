"""Bridge from a cluster's engine pods to the test exporter: every Tandem engine pod gets vLLM metrics.

What it owns: keeping `tandem_lab.dev.exporter.Exporter`'s simulated pods equal to the engine pods that
exist in some namespaces (polled with kubectl), and registering each with Prometheus through file_sd
with the series label contract (`namespace`, `pool`, `revision`, `role`, `pair`, `pod`). KWOK pods
run no engine, so this is how a real Prometheus and the real operator see per-revision behaviour in
cluster tests and the demo; behaviour is scripted per revision on the exporter.

Dev tooling only (subprocess I/O is fine here); the operator never imports it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.api.labels import COMPONENT_ENGINE, LABEL_COMPONENT, LABEL_PAIR, LABEL_POOL, LABEL_REVISION, LABEL_ROLE
from tandem_lab.dev.exporter import EnginePod, Exporter, TargetRegistry
from tandem_lab.dev.kube import Kubectl, KubectlError


@dataclass
class PodMetricsBridge:
    """Mirror engine pods into the exporter and Prometheus targets; `start()` polls in a thread."""

    kube: Kubectl
    namespaces: Sequence[str]
    exporter: Exporter
    registry: TargetRegistry
    interval_s: float = 1.0
    prefix: str = "engine"
    _known: dict[str, EnginePod] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def engine_pods(self) -> list[EnginePod]:
        out = []
        for ns in self.namespaces:
            data = self.kube.json("get", "pods", "-n", ns, "-l", f"{LABEL_COMPONENT}={COMPONENT_ENGINE}", "-o", "json")
            for pod in data["items"]:
                meta = pod["metadata"]
                labels = meta.get("labels") or {}
                if meta.get("deletionTimestamp") or not pod.get("spec", {}).get("nodeName"):
                    continue
                role = labels.get(LABEL_ROLE)
                if role not in ("prefill", "decode"):
                    continue
                out.append(
                    EnginePod(
                        name=meta["name"],
                        namespace=ns,
                        pool=labels.get(LABEL_POOL, ""),
                        revision=labels.get(LABEL_REVISION, ""),
                        role=role,
                        pair=labels.get(LABEL_PAIR, ""),
                    )
                )
        return out

    def _key(self, pod: EnginePod) -> str:
        return f"{pod.namespace}/{pod.name}"

    def sync(self) -> int:
        """One reconciliation of exporter pods and scrape targets; returns the number of pods."""
        current = {self._key(p): p for p in self.engine_pods()}
        for key, pod in list(self._known.items()):
            if current.get(key) != pod:
                self.exporter.remove_pod(pod.name)
                self.registry.remove_target(self._target_name(pod))
                del self._known[key]
        added = [p for key, p in current.items() if key not in self._known]
        if added:
            self.exporter.add_pods(added)
            for pod in added:
                targets, labels = self.exporter.target(pod.name)
                self.registry.add_target(self._target_name(pod), targets, labels)
                self._known[self._key(pod)] = pod
        return len(self._known)

    def _target_name(self, pod: EnginePod) -> str:
        return f"{self.prefix}-{pod.namespace}-{pod.name}"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(KubectlError):
                self.sync()

    def start(self) -> PodMetricsBridge:
        self.sync()
        self._thread = threading.Thread(target=self._loop, name="pod-metrics-bridge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for pod in list(self._known.values()):
            self.registry.remove_target(self._target_name(pod))
        self._known.clear()
