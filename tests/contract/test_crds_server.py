"""The generated CRDs on the real API server: install, examples, bad inputs, printer columns, explain,
status round-trip, and `tandem validate` agreeing with the server on random specs."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.api.common import Condition
from tandem.api.pool_status import (
    AnalysisProgress,
    GateVerdict,
    InferencePoolStatus,
    PairCounts,
    RevisionsStatus,
    RevisionStatus,
    RolloutStatus,
    RoutingTableStatus,
    ScalingDecision,
    VersionScore,
)
from tandem.api.validate import validate_object
from tandem_lab.dev.kube import Kubectl, KubectlError
from tests.support.catalog import BadInput, case_params, example_files
from tests.support.tandem_cluster import REPO, wait_until


def server_dry_run(kube: Kubectl, namespace: str, obj: dict[str, Any]) -> str | None:
    """None when the API server accepts ``obj`` (dry run), else its error text."""
    try:
        kube.run("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
    except KubectlError as exc:
        return exc.stderr
    return None


def test_crds_are_established_and_explained(crds: Kubectl) -> None:
    out = crds.run("get", "crd", "inferencepools.tandem.dev", "mooncakecaches.tandem.dev").stdout
    assert "inferencepools.tandem.dev" in out and "mooncakecaches.tandem.dev" in out
    # The API server publishes a new CRD's OpenAPI a few seconds after it is Established.
    explain = wait_until(
        "kubectl explain to know the CRD",
        lambda: crds.run("explain", "inferencepools.tandem.dev.spec.pairs.replicas").stdout,
        timeout_s=60,
        interval_s=1,
    )
    assert "Pair groups to run" in explain
    explain = crds.run("explain", "inferencepools.tandem.dev.spec.rollout.steps").stdout
    assert "exactly one action" in explain or "Steps, in order" in explain
    explain = crds.run("explain", "mcache.spec.store.segmentSize").stdout
    assert "global_segment_size" in explain


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in example_files()])
def test_every_example_applies(crds: Kubectl, ns: str, path: Path) -> None:
    out = crds.run("apply", "--dry-run=server", "-n", ns, "-f", str(path)).stdout
    assert "created (server dry run)" in out


@pytest.mark.parametrize("case", case_params())
def test_api_server_rejects_bad_input_naming_the_field(crds: Kubectl, ns: str, case: BadInput) -> None:
    if not case.server:
        pytest.skip(f"{case.id}: refused by tandem validate only; the API server needs a webhook or VAP for it")
    if case.old is not None:
        crds.run("create", "-n", ns, "-f", "-", stdin=json.dumps(case.old))
    error = server_dry_run(crds, ns, case.new)
    assert error is not None, f"{case.id} accepted by the API server"
    for want_field, want_text in case.expect:
        assert want_text in error, f"{case.id}: {want_text!r} not in {error!r}"
        if want_field:
            assert want_field in error, f"{case.id}: field {want_field!r} not named in {error!r}"


def test_printer_columns(crds: Kubectl, ns: str) -> None:
    crds.run("apply", "-n", ns, "-f", str(REPO / "examples" / "minimal-pool.yaml"))
    out = crds.run("get", "inferencepools.tandem.dev", "-n", ns).stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "VERSION", "PAIRS", "STEP", "READY", "AGE"]
    assert "Qwen/Qwen3-8B" in out and "v1" in out
    wide = crds.run("get", "tpool", "-n", ns, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[-4:] == ["CLASS", "STABLE", "CANARY", "PHASE"]
    assert "minimal" in crds.run("get", "tandem", "-n", ns).stdout  # the category


def full_status() -> InferencePoolStatus:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    rev = RevisionStatus(
        name="a1b2c3d4e5", version="v32", image="x@sha256:" + "0" * 64, pairs=8, ready_pairs=7, weight_percent=90
    )
    return InferencePoolStatus(
        observed_generation=3,
        conditions=[
            Condition(
                type="Ready",
                status="True",
                reason="AllPairsReady",
                message="8/8",
                last_transition_time=now,
                observed_generation=3,
            )
        ],
        replicas=8,
        selector="tandem.dev/component=engine,tandem.dev/pool=speed",
        pairs=PairCounts(desired=8, current=8, ready=7, updated=1, draining=1, pending=2, summary="7/8"),
        revisions=RevisionsStatus(
            stable=rev, canary=rev.model_copy(update={"name": "f0e1d2c3b4", "weight_percent": 10})
        ),
        rollout=RolloutStatus(
            phase="Progressing",
            revision="f0e1d2c3b4",
            step_index=1,
            step_count=4,
            step="2/4",
            steps_hash="0123456789abcdef",
            step_started_at=now,
            progress_at=now,
            analysis=AnalysisProgress(
                success_streak=2, failures=0, no_data_since=now, last_evaluated_at=now, eval_job="speed-eval"
            ),
            gates=[
                GateVerdict(
                    name="ttft-p95",
                    verdict="NoData",
                    reason="Stale",
                    value="NaN",
                    baseline="0.8",
                    condition="result <= 1.0",
                    query="q",
                    evaluated_at=now,
                )
            ],
            message="analysing",
            failed_revision="",
            handled_action="p1",
        ),
        scorecard=[
            VersionScore(
                version="v32",
                revision="a1b2c3d4e5",
                ttft_p90_ms=420.5,
                ttft_p95_ms=610.25,
                tokens_per_second_per_user=96.5,
                error_rate_percent=0.12,
                local_kv_hit_percent=89.5,
                eval_score_percent=98.7,
                updated_at=now,
            )
        ],
        last_scaling=ScalingDecision(
            time=now, from_pairs=6, to_pairs=8, reason="ScaleUpTTFT", message="ttft", metrics={"ttftP95": "1.2"}
        ),
        routing=RoutingTableStatus(config_map="speed-routing", fingerprint="abcdef0123456789", serving_pairs=7),
    )


def test_status_round_trips_without_pruning(crds: Kubectl, ns: str) -> None:
    crds.run("apply", "-n", ns, "-f", str(REPO / "examples" / "minimal-pool.yaml"))
    obj = crds.json("get", "inferencepools.tandem.dev", "minimal", "-n", ns, "-o", "json")
    status = full_status()
    obj["status"] = status.wire()
    crds.run("replace", "--subresource=status", "-n", ns, "-f", "-", stdin=json.dumps(obj))
    back = crds.json("get", "inferencepools.tandem.dev", "minimal", "-n", ns, "-o", "json")["status"]
    assert InferencePoolStatus.model_validate(back) == status
    assert back == status.wire()


def test_spec_round_trips_without_pruning(crds: Kubectl, ns: str) -> None:
    obj = yaml.safe_load((REPO / "examples" / "speed-pool.yaml").read_text())
    crds.run("create", "-n", ns, "-f", "-", stdin=json.dumps(obj))
    back = crds.json("get", "inferencepools.tandem.dev", "speed", "-n", ns, "-o", "json")["spec"]

    def subset(want: Any, got: Any, path: str = "spec") -> None:
        if isinstance(want, dict):
            for key, value in want.items():
                assert key in got, f"{path}.{key} pruned"
                subset(value, got[key], f"{path}.{key}")
        elif isinstance(want, list):
            assert len(want) == len(got), path
            for i, (a, b) in enumerate(zip(want, got, strict=True)):
                subset(a, b, f"{path}[{i}]")
        else:
            assert want == got, path

    subset(obj["spec"], back)


def test_scale_subresource(crds: Kubectl, ns: str) -> None:
    crds.run("apply", "-n", ns, "-f", str(REPO / "examples" / "minimal-pool.yaml"))
    crds.run("scale", "inferencepools.tandem.dev/minimal", "-n", ns, "--replicas=3")
    spec = crds.json("get", "inferencepools.tandem.dev", "minimal", "-n", ns, "-o", "json")["spec"]
    assert spec["pairs"]["replicas"] == 3


# --- differential: tandem validate vs the API server ---------------------------------------------

BASE = yaml.safe_load((REPO / "examples" / "minimal-pool.yaml").read_text())
MUTATIONS: list[tuple[str, Any]] = [
    ("spec.pairs.replicas", st.integers(min_value=-3, max_value=600)),
    ("spec.pairs.prefill.gpusPerInstance", st.integers(min_value=0, max_value=9)),
    ("spec.pairs.prefill.tensorParallel", st.integers(min_value=1, max_value=8)),
    ("spec.pairs.decode.instances", st.integers(min_value=-1, max_value=17)),
    ("spec.autoscaling.minPairs", st.integers(min_value=-1, max_value=520)),
    ("spec.autoscaling.maxPairs", st.integers(min_value=0, max_value=520)),
    ("spec.model.quantization", st.sampled_from(["fp4", "fp8", "bf16", "fp5", "int4"])),
    ("spec.model.maxContextTokens", st.integers(min_value=-1, max_value=5_000_000)),
    ("spec.rollout.maxSurge", st.integers(min_value=-1, max_value=3)),
    ("spec.rollout.maxUnavailable", st.integers(min_value=0, max_value=3)),
    ("spec.rollout.analysis.timeout", st.sampled_from(["5s", "30s", "1m", "10x"])),
    ("spec.rollout.analysis.failureLimit", st.integers(min_value=-3, max_value=3)),
    ("spec.rollout.analysis.onNoData", st.sampled_from(["Pause", "Rollback", "Ignore"])),
    (
        "spec.rollout.steps",
        st.lists(
            st.sampled_from(
                [
                    {"setWeight": 10},
                    {"setWeight": 50},
                    {"setWeight": 0},
                    {"setCanaryPairs": 2},
                    {"pause": {}},
                    {"analysis": {}},
                    {},
                    {"setWeight": 20, "pause": {}},
                ]
            ),
            max_size=4,
        ),
    ),
    ("spec.traffic.match.minPromptTokens", st.integers(min_value=0, max_value=9000)),
    ("spec.traffic.match.maxPromptTokens", st.integers(min_value=1, max_value=9000)),
    ("spec.placement.gpuBudget", st.integers(min_value=1, max_value=100)),
    ("spec.stack.image", st.sampled_from([BASE["spec"]["stack"]["image"], "vllm:latest", "r@sha256:abc"])),
    ("metadata.name", st.sampled_from(["ok", "a" * 40, "a" * 41, "Bad", "a.b", "1abc"])),
    # issue 19: hostile values
    (
        "metadata.labels",
        st.dictionaries(
            st.sampled_from(["a", "example.com/b", "-c", "d" * 64]),
            st.sampled_from(["x", "", "-y", "z" * 64]),
            max_size=2,
        ),
    ),
    ("spec.pairs.drainTimeout", st.sampled_from(["30s", "2562047h", "2562047h47m16s", "2562048h", "99999999999999h"])),
    ("spec.rollout.progressDeadline", st.sampled_from(["1h", "1.5h", "0s", "9223372036s", "9223372037s"])),
    (
        "spec.stack.args",
        st.lists(
            st.sampled_from(
                [
                    "--enable-chunked-prefill",
                    "--port=9000",
                    "--port",
                    "9000",
                    "--max_num_seqs=8",
                    "--max-num-batched-tokens=8192",
                    "-tp=2",
                    "--trust-remote-code",
                    "--no-trust-remote-code",
                    "--portal",
                ]
            ),
            max_size=3,
        ),
    ),
    (
        "spec.stack.env",
        st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["HF_TOKEN", "LD_PRELOAD", "VLLM_X", "MAX_TOKENS", "api_key", "ENV"]),
                    "value": st.sampled_from(["", "1", "secret"]),
                }
            ),
            max_size=2,
        ),
    ),
    ("spec.stack.prefill.resources.memory", st.sampled_from(["64Gi", "7Ei", "8Ei", "9999999999999999E"])),
    ("spec.rollout.analysis.prometheusAddress", st.sampled_from(["http://p:9090", "https://u@p", "https://u:p@p"])),
]


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        obj = obj.setdefault(key, {})
    obj[keys[-1]] = value


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    chosen = draw(st.lists(st.sampled_from(range(len(MUTATIONS))), min_size=1, max_size=3, unique=True))
    for index in chosen:
        path, strategy = MUTATIONS[index]
        _set(obj, path, draw(strategy))
    return obj


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(obj=specs())
def test_validate_agrees_with_the_api_server(crds: Kubectl, ns: str, obj: dict[str, Any]) -> None:
    offline = validate_object(obj)
    server = server_dry_run(crds, ns, obj)
    assert (offline == []) == (server is None), f"offline={[str(e) for e in offline]} server={server}"


# --- hostile objects and files (issue 19): tandem validate vs the API server -----------------------

HOSTILE_OBJECTS: list[tuple[str, str, Any]] = [
    ("name-not-dns", "metadata.name", "Bad_Name"),
    ("label-value-int", "metadata.labels", {"a": 1}),
    ("label-key-bad", "metadata.labels", {"-x": "y"}),
    ("label-prefixed-ok", "metadata.labels", {"example.com/team": "ml"}),
    ("label-value-too-long", "metadata.labels", {"x": "a" * 64}),
    ("annotations-list", "metadata.annotations", ["x"]),
    ("annotation-ok", "metadata.annotations", {"tandem.dev/note": "free text: ok!"}),
    ("metadata-unknown-field", "metadata.owner", "me"),
    ("generation-string", "metadata.generation", "x"),
    ("replicas-beyond-int64", "spec.pairs.replicas", 2**64),
    ("duration-largest-ok", "spec.pairs.drainTimeout", "2562047h"),
    ("duration-past-rule", "spec.pairs.drainTimeout", "2562047h47m16s"),
    ("duration-past-go", "spec.pairs.orphanTimeout", "99999999999999h"),
    (
        "env-secret-ref-ok",
        "spec.stack.env",
        [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
    ),
    ("env-literal-token", "spec.stack.env", [{"name": "HF_TOKEN", "value": "hf_x"}]),
    ("env-ld-preload", "spec.stack.decode.env", [{"name": "LD_PRELOAD", "value": "/x.so"}]),
    ("arg-ok", "spec.stack.args", ["--enable-chunked-prefill", "--max-num-batched-tokens=8192"]),
    ("arg-port", "spec.stack.prefill.args", ["--port=9000"]),
    ("arg-trust-remote-code", "spec.stack.args", ["--trust-remote-code"]),
    ("creation-timestamp-date", "metadata.creationTimestamp", "2020-01-01"),
    ("finalizers-not-list", "metadata.finalizers", "tandem.dev/finalizer"),
    ("memory-ok", "spec.stack.prefill.resources", {"memory": "512Gi", "cpu": "500m"}),
    ("memory-beyond-8Ei", "spec.stack.decode.resources", {"memory": "9999999999999999E"}),
    ("prometheus-user-ok", "spec.rollout.analysis.prometheusAddress", "https://reader@prometheus:9090"),
    ("prometheus-password", "spec.rollout.analysis.prometheusAddress", "https://a:b@prometheus:9090"),
]


@pytest.mark.parametrize(("path", "value"), [pytest.param(p, v, id=i) for i, p, v in HOSTILE_OBJECTS])
def test_validate_agrees_with_the_api_server_on_hostile_objects(crds: Kubectl, ns: str, path: str, value: Any) -> None:
    obj = copy.deepcopy(BASE)
    _set(obj, path, value)
    offline = validate_object(obj)
    server = server_dry_run(crds, ns, obj)
    assert (offline == []) == (server is None), f"offline={[str(e) for e in offline]} server={server}"


_POOL_TEXT = (REPO / "examples" / "minimal-pool.yaml").read_text(encoding="utf-8")
HOSTILE_FILES: list[tuple[str, str]] = [
    ("wrong-version", _POOL_TEXT.replace("tandem.dev/v1alpha1", "tandem.dev/v1")),
    ("unknown-kind", _POOL_TEXT.replace("kind: InferencePool", "kind: InferencePol")),
    (
        "list-with-a-bad-item",
        "apiVersion: v1\nkind: List\nitems:\n- " + json.dumps({**BASE, "metadata": {"name": "Bad"}}),
    ),
    ("list-all-good", "apiVersion: v1\nkind: List\nitems:\n- " + json.dumps(BASE)),
]


@pytest.mark.parametrize("text", [pytest.param(t, id=i) for i, t in HOSTILE_FILES])
def test_validate_files_agrees_with_kubectl_apply(crds: Kubectl, ns: str, tmp_path: Path, text: str) -> None:
    from tandem.api.commands import validate_files  # noqa: PLC0415 - only this test needs the CLI layer

    path = tmp_path / "m.yaml"
    path.write_text(text, encoding="utf-8")
    offline = validate_files([path])
    try:
        crds.run("apply", "--dry-run=server", "-n", ns, "-f", str(path))
        server = None
    except KubectlError as exc:
        server = exc.stderr
    assert (offline == []) == (server is None), f"offline={[f'{w}: {e}' for w, e in offline]} server={server}"


def test_duplicate_keys_refused_offline_while_kubectl_keeps_the_last(crds: Kubectl, ns: str, tmp_path: Path) -> None:
    """A deliberate difference (testing.md §6.1): kubectl's YAML conversion keeps the last of two equal keys,
    so the server never sees the first; `tandem validate` refuses the file instead of guessing."""
    from tandem.api.commands import validate_files  # noqa: PLC0415 - only this test needs the CLI layer

    path = tmp_path / "dup.yaml"
    path.write_text(_POOL_TEXT.replace("spec:\n", "spec:\n  pairs: {replicas: 1}\n  pairs: {replicas: 2}\n", 1))
    offline = validate_files([path])
    assert any("duplicate field" in e.message for _, e in offline)
    out = crds.run("apply", "--dry-run=server", "-n", ns, "-f", str(path)).stdout
    assert "created (server dry run)" in out


# --- the generated hostile corpus (issue 19 classes 1-5): kubectl apply and tandem validate agree ---------

HOSTILE_WORKERS = 4
"""Concurrent dry runs: each is one kubectl process; four keep a 2-core machine busy without starving it."""


def test_generated_hostile_corpus_is_refused_by_both_naming_the_same_field(crds: Kubectl, ns: str) -> None:
    """Every mutant of the generated corpus (tests/support/hostile_corpus.py, seeded) is refused by the API
    server (server-side dry run, strict field validation) and by `tandem validate`, and both name the field
    the mutation targeted. All mismatches are reported at once."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - only this test runs kubectl in threads

    from tests.support.hostile_corpus import corpus  # noqa: PLC0415 - heavy import, this test only

    mutants = corpus()
    with ThreadPoolExecutor(HOSTILE_WORKERS) as pool:
        server = list(pool.map(lambda m: server_dry_run(crds, ns, m.obj), mutants))
    problems: list[str] = []
    for mutant, said in zip(mutants, server, strict=True):
        offline = validate_object(mutant.obj)
        if said is None:
            problems.append(f"{mutant.id}: the API server accepted it")
        elif mutant.server_says not in said:
            problems.append(f"{mutant.id}: the API server did not name {mutant.server_says!r}: {said.strip()[:300]}")
        if not offline:
            problems.append(f"{mutant.id}: tandem validate accepted it")
        elif mutant.field not in [e.path for e in offline]:
            problems.append(f"{mutant.id}: tandem validate did not name {mutant.field!r}: {[str(e) for e in offline]}")
    assert not problems, f"{len(problems)} of {len(mutants)} mutants disagree:\n" + "\n".join(problems)
