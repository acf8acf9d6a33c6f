"""The pool's other children: headless Service, routing-table ConfigMap, revision snapshots, Events.

What it owns: pure manifests for the objects around the instance pods. The routing ConfigMap carries
the table's fingerprint as an annotation so the operator can compare without parsing; a revision
snapshot holds the `RevisionSpec` pods of that revision are built from.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tandem.api.labels import (
    COMPONENT_ENGINE,
    COMPONENT_REVISION,
    COMPONENT_ROUTING,
    LABEL_COMPONENT,
    LABEL_REVISION,
    pool_selector,
    revision_configmap_name,
    routing_configmap_name,
    service_name,
)
from tandem.api.revision import RevisionSpec
from tandem.builders.common import base_labels, metadata, owner_reference
from tandem.builders.pods import ENGINE_PORT
from tandem.routing.table import CONFIGMAP_KEY, RoutingTable

ANNOTATION_FINGERPRINT = "tandem.dev/fingerprint"
REVISION_KEY = "revision.json"


def build_service(pool: str, namespace: str, uid: str) -> dict[str, Any]:
    """Headless Service over every engine pod of the pool (DNS per pod; metrics on the http port)."""
    labels = base_labels(pool) | {LABEL_COMPONENT: COMPONENT_ENGINE}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(service_name(pool), namespace, labels, owner_reference("InferencePool", pool, uid)),
        "spec": {
            "clusterIP": "None",
            "selector": pool_selector(pool),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
            "publishNotReadyAddresses": False,
        },
    }


def build_routing_configmap(table: RoutingTable, uid: str) -> dict[str, Any]:
    """ConfigMap `<pool>-routing` with the table as JSON (key `routing.json`)."""
    labels = base_labels(table.pool) | {LABEL_COMPONENT: COMPONENT_ROUTING}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            routing_configmap_name(table.pool),
            table.namespace,
            labels,
            owner_reference("InferencePool", table.pool, uid),
            {ANNOTATION_FINGERPRINT: table.fingerprint()},
        ),
        "data": {CONFIGMAP_KEY: table.to_json()},
    }


def build_revision_configmap(pool: str, namespace: str, uid: str, revision: str, spec: RevisionSpec) -> dict[str, Any]:
    """ConfigMap `<pool>-rev-<revision>`: the snapshot pods of that revision are built from."""
    labels = base_labels(pool) | {LABEL_COMPONENT: COMPONENT_REVISION, LABEL_REVISION: revision}
    body = json.dumps(spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True, indent=1)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            revision_configmap_name(pool, revision), namespace, labels, owner_reference("InferencePool", pool, uid)
        ),
        "data": {REVISION_KEY: body},
    }


def parse_revision_configmap(data: dict[str, str]) -> RevisionSpec:
    return RevisionSpec.model_validate_json(data[REVISION_KEY])


def build_event(
    *,
    kind: str,
    name: str,
    namespace: str,
    uid: str,
    type_: str,
    reason: str,
    message: str,
    now: datetime,
    api_version: str = "tandem.dev/v1alpha1",
) -> dict[str, Any]:
    """A core/v1 Event about a Tandem object (message bounded)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace, "uid": uid},
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "tandem-operator"},
        "reportingComponent": "tandem.dev/operator",
        "reportingInstance": "tandem-operator",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
