"""Our KWOK Stage set: complete, well-formed and with mutually exclusive pod selectors."""

from __future__ import annotations

from typing import Any

import pytest

from tandem_lab.dev import stages


def _by_name(**kwargs: Any) -> dict[str, dict[str, Any]]:
    built = stages.build_stages(kube_version="v1.34.4", kwok_version="v0.8.0", **kwargs)
    return {s["metadata"]["name"]: s for s in built}


def _keys(stage: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        e["jq"]["key"]: (e["jq"]["operator"], tuple(e["jq"].get("values", [])))
        for e in stage["spec"]["selector"]["matchExpressions"]
    }


def test_stage_set_covers_node_and_pod_lifecycle() -> None:
    got = _by_name()
    assert set(got) == {
        "tandem-node-initialize",
        "tandem-node-heartbeat",
        "tandem-pod-start",
        "tandem-pod-ready",
        "tandem-pod-crashloop",
        "tandem-pod-fail",
        "tandem-pod-complete",
        "tandem-pod-delete",
        "tandem-pod-delete-strip-finalizers",
    }
    for stage in got.values():
        assert stage["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
        assert stage["kind"] == "Stage"
        assert stage["spec"]["steps"], stage["metadata"]["name"]


def test_ready_delay_defaults_and_annotation_override() -> None:
    delay = _by_name(load_delay_s=20, load_jitter_s=40)["tandem-pod-ready"]["spec"]["delay"]
    assert delay["durationMilliseconds"] == 20_000
    assert delay["jitterDurationMilliseconds"] == 60_000  # an upper bound: base + jitter
    assert stages.ANNOTATION_SIM_LOAD_SECONDS in delay["durationFrom"]["jq"]["expression"]
    jitter = delay["jitterDurationFrom"]["jq"]["expression"]
    assert '// "20"' in jitter and '// "40"' in jitter
    assert stages.ANNOTATION_SIM_LOAD_JITTER_SECONDS in jitter


def test_zero_delay_renders_zero_milliseconds() -> None:
    delay = _by_name()["tandem-pod-ready"]["spec"]["delay"]
    assert delay["durationMilliseconds"] == 0 and delay["jitterDurationMilliseconds"] == 0


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("tandem-pod-ready", "tandem-pod-crashloop", id="ready vs crashloop"),
        pytest.param("tandem-pod-ready", "tandem-pod-fail", id="ready vs fail"),
        pytest.param("tandem-pod-start", "tandem-pod-ready", id="start vs ready"),
        pytest.param("tandem-pod-ready", "tandem-pod-complete", id="ready vs complete"),
        pytest.param("tandem-pod-delete", "tandem-pod-delete-strip-finalizers", id="delete variants"),
    ],
)
def test_pod_stage_selectors_are_mutually_exclusive(first: str, second: str) -> None:
    """KWOK picks at random among matching stages, so each pair must disagree on some key."""
    got = _by_name()
    a, b = _keys(got[first]), _keys(got[second])
    contradictions = []
    for key in set(a) & set(b):
        (op_a, vals_a), (op_b, vals_b) = a[key], b[key]
        ops = {op_a, op_b}
        exists_vs_absent = ops in ({"Exists", "DoesNotExist"}, {"In", "DoesNotExist"})
        disjoint_in = op_a == op_b == "In" and not set(vals_a) & set(vals_b)
        in_vs_not_in = ops == {"In", "NotIn"} and set(vals_a) == set(vals_b)
        if exists_vs_absent or disjoint_in or in_vs_not_in:
            contradictions.append(key)
    assert contradictions, f"{first} and {second} can match the same pod"


def test_templates_fill_versions() -> None:
    init = _by_name()["tandem-node-initialize"]["spec"]["steps"][0]["patch"]
    assert init["subresource"] == "status" and init["root"] == "status"
    assert '"v1.34.4"' in init["template"] and "kwok://v0.8.0" in init["template"]
    assert "%(" not in init["template"]


def test_negative_delay_is_rejected() -> None:
    with pytest.raises(ValueError):
        stages.build_stages(kube_version="v1.34.4", kwok_version="v0.8.0", load_delay_s=-1)
