"""Instance pods record their revision where a foreign writer cannot change it (the engine's env)."""

from __future__ import annotations

import copy

import pytest

from tandem.api.labels import LABEL_REVISION
from tandem.api.revision import revision_id, revision_spec
from tandem.builders.pods import InstanceParams, build_instance_pod
from tandem.core.observed import parse_pod
from tests.support.factories import make_pool

pytestmark = pytest.mark.unit


def test_pod_env_records_the_revision_and_parse_prefers_it_over_an_edited_label() -> None:
    spec = revision_spec(make_pool().pairs(1).obj().spec)
    rev = revision_id(spec)
    params = InstanceParams(
        pool="speed", namespace="ns", pool_uid="u", pair=0, role="prefill", instance=0, revision=rev, spec=spec
    )
    pod = build_instance_pod(params)
    env = {v["name"]: v.get("value") for v in pod["spec"]["containers"][0]["env"]}
    assert env["TANDEM_REVISION"] == rev
    observed = parse_pod(pod)
    assert observed.built_revision == rev and observed.revision == rev and not observed.label_drift

    edited = copy.deepcopy(pod)
    edited["metadata"]["labels"][LABEL_REVISION] = "foreign"
    drifted = parse_pod(edited)
    assert drifted.revision == rev and drifted.label_drift

    legacy = copy.deepcopy(pod)  # a pod built before the env existed: the label is all there is
    legacy["spec"]["containers"][0]["env"] = [
        v for v in legacy["spec"]["containers"][0]["env"] if v["name"] != "TANDEM_REVISION"
    ]
    assert parse_pod(legacy).revision == rev and not parse_pod(legacy).label_drift
