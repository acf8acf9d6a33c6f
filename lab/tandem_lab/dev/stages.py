"""Our KWOK Stages: how simulated nodes and pods move through their lifecycle.

What it owns: the complete Stage set handed to kwokctl (kwokctl adds its defaults only when the config
has no Stage, so this set must be whole: nodes become Ready and heartbeat; pods start, load, become
Ready, crash, fail, complete and get deleted), and the pod annotations tests use to steer them.

Pod lifecycle (KWOK pods never run; these stages write their status):

1. ``tandem-pod-start``: a bound Pending pod becomes Running with its containers started but not
   ready (Ready=False, ContainersNotReady), as a vLLM pod looks while it loads a model.
2. ``tandem-pod-ready``: after the load delay, Ready=True. Delay = ``tandem.dev/sim-load-seconds``
   (number of seconds) if set, else the cluster default; plus a uniform random extra of up to
   ``tandem.dev/sim-load-jitter-seconds`` (else the cluster default jitter).
3. ``tandem-pod-crashloop``: ``tandem.dev/sim-fail: crashloop`` -> Running, Ready=False, every
   container waiting in CrashLoopBackOff with ``restartCount`` = ``tandem.dev/sim-restart-count``
   (default 5), after ``tandem.dev/sim-fail-after-seconds`` (default 1). Can be set on a Ready pod to
   break it later. Terminal for that pod (delete it to recover).
4. ``tandem-pod-fail``: ``tandem.dev/sim-fail: fail`` -> phase Failed, containers terminated exit 1
   (meant for ``restartPolicy: Never`` pods such as an eval Job's; a kubelet would restart others).
5. ``tandem-pod-complete``: a Ready pod owned by a Job -> Succeeded after
   ``tandem.dev/sim-run-seconds`` (default 0), so an eval Job passes by default; a container env var
   ``SIM_EVAL_SCORE=<n>`` becomes its termination message ``{"score": <n>}`` (what a real eval
   image writes), so a test can script an eval result through the eval gate's own ``env``.
6. ``tandem-pod-delete``: a pod with a deletionTimestamp is deleted with grace period 0, as the
   kubelet does once containers stop. Finalizers stay with their owners (a pod with a finalizer stays
   Terminating until its controller removes it, like on a real cluster) unless the pod carries
   ``tandem.dev/sim-strip-finalizers: "true"``.

KWOK semantics relied on (kwok v0.8.0 ``pkg/utils/lifecycle``): ``delay.durationFrom`` (jq) wins over
``durationMilliseconds`` when it yields a Go duration string; ``jitterDurationFrom`` is an absolute upper
bound, and when it is <= the duration it *replaces* it, so the jitter expression below always computes
load + jitter. A jq error or a missing annotation falls back to the static milliseconds. When several
stages match one object KWOK picks one at random, so the selectors here are mutually exclusive.

Invariants: pure (returns dicts); no stage matches its own output (no patch loops); annotation values
are plain numbers of seconds.
"""

from __future__ import annotations

from typing import Any

API_VERSION = "kwok.x-k8s.io/v1alpha1"

ANNOTATION_SIM_LOAD_SECONDS = "tandem.dev/sim-load-seconds"
ANNOTATION_SIM_LOAD_JITTER_SECONDS = "tandem.dev/sim-load-jitter-seconds"
ANNOTATION_SIM_FAIL = "tandem.dev/sim-fail"
ANNOTATION_SIM_FAIL_AFTER_SECONDS = "tandem.dev/sim-fail-after-seconds"
ANNOTATION_SIM_RESTART_COUNT = "tandem.dev/sim-restart-count"
ANNOTATION_SIM_RUN_SECONDS = "tandem.dev/sim-run-seconds"
ANNOTATION_SIM_STRIP_FINALIZERS = "tandem.dev/sim-strip-finalizers"
SIM_FAIL_CRASHLOOP = "crashloop"
SIM_FAIL_FAIL = "fail"

NODE_HEARTBEAT_MS = 50_000  # node conditions refresh; liveness itself comes from the node Lease


def _jq(key: str, operator: str, values: list[str] | None = None) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expr["values"] = values
    return {"jq": expr}


def _annotation(name: str) -> str:
    return f'.metadata.annotations["{name}"]'


def _seconds_expr(annotation: str) -> str:
    """jq: the annotation's number of seconds as a Go duration ("20" -> "20s"), else nothing."""
    return f'{_annotation(annotation)} | select(. != null) | tonumber | tostring + "s"'


def _upper_bound_expr(base_annotation: str, jitter_annotation: str, base_s: float, jitter_s: float) -> str:
    """jq: (annotation or default base) + (annotation or default jitter), as a Go duration."""
    return (
        f'(({_annotation(base_annotation)} // "{base_s:g}") | tonumber) + '
        f'(({_annotation(jitter_annotation)} // "{jitter_s:g}") | tonumber) | tostring + "s"'
    )


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _stage(
    name: str,
    kind: str,
    selector: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    delay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "steps": steps,
    }
    if delay:
        spec["delay"] = delay
    return {"apiVersion": API_VERSION, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _status_patch(template: str) -> dict[str, Any]:
    return {"patch": {"subresource": "status", "root": "status", "template": template}}


_NOT_DELETED = _jq(".metadata.deletionTimestamp", "DoesNotExist")
_READY_NOT_TRUE = _jq('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", ["True"])
_READY_TRUE = _jq('.status.conditions.[] | select( .type == "Ready" ) | .status', "In", ["True"])
_NOT_CRASHLOOPING = _jq(".status.containerStatuses.[].state.waiting.reason", "NotIn", ["CrashLoopBackOff"])
_NO_SIM_FAIL = _jq(_annotation(ANNOTATION_SIM_FAIL), "DoesNotExist")

_POD_IPS = (
    '{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) '
    '( or .metadata.name "" ) ( or .metadata.namespace "" ) }}'
)
_UNREADY_NAMES = "[{{ range $i, $c := .spec.containers }}{{ if $i }} {{ end }}{{ $c.name }}{{ end }}]"

NODE_INITIALIZE_TEMPLATE = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
{{ if not .status.addresses }}
addresses:
- address: {{ .metadata.name | Quote }}
  type: Hostname
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
{{ $info := or .status.nodeInfo dict }}
nodeInfo:
  architecture: {{ or $info.architecture "amd64" | Quote }}
  bootID: {{ or $info.bootID "" | Quote }}
  containerRuntimeVersion: {{ or $info.containerRuntimeVersion "kwok://%(kwok_version)s" | Quote }}
  kernelVersion: {{ or $info.kernelVersion "6.8.0-kwok" | Quote }}
  kubeProxyVersion: {{ or $info.kubeProxyVersion "%(kube_version)s" | Quote }}
  kubeletVersion: {{ or $info.kubeletVersion "%(kube_version)s" | Quote }}
  machineID: {{ or $info.machineID "" | Quote }}
  operatingSystem: {{ or $info.operatingSystem "linux" | Quote }}
  osImage: {{ or $info.osImage "" | Quote }}
  systemUUID: {{ or $info.systemUUID "" | Quote }}
phase: Running
"""

NODE_HEARTBEAT_TEMPLATE = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

POD_START_TEMPLATE = (
    """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodReadyToStartContainers
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  message: 'containers with unready status: """
    + _UNREADY_NAMES
    + """'
  reason: ContainersNotReady
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  message: 'containers with unready status: """
    + _UNREADY_NAMES
    + """'
  reason: ContainersNotReady
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with .spec.initContainers }}
initContainerStatuses:
{{ range . }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  restartCount: 0
  {{ if eq (or .restartPolicy "") "Always" }}
  ready: true
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
  {{ else }}
  ready: true
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
  {{ end }}
{{ end }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
"""
    + _POD_IPS
    + """
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""
)

# Pod status lists have no merge key (containerStatuses is replaced whole by a strategic merge
# patch), so every stage writes complete container entries; conditions merge by type, hence the
# explicit nulls that clear an earlier reason/message.
POD_READY_TEMPLATE = """\
{{ $now := Now }}
{{ $started := or .status.startTime $now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  message: null
  reason: null
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  message: null
  reason: null
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $started | Quote }}
{{ end }}
"""

POD_CRASHLOOP_TEMPLATE = (
    """\
{{ $now := Now }}
{{ $annotations := or .metadata.annotations dict }}
{{ $restarts := or ( index $annotations "%(restart_annotation)s" ) "5" }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  message: 'containers with unready status: """
    + _UNREADY_NAMES
    + """'
  reason: ContainersNotReady
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  message: 'containers with unready status: """
    + _UNREADY_NAMES
    + """'
  reason: ContainersNotReady
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: {{ $restarts }}
  lastState:
    terminated:
      exitCode: 1
      reason: Error
      startedAt: {{ or $.status.startTime $now | Quote }}
      finishedAt: {{ $now | Quote }}
  state:
    waiting:
      reason: CrashLoopBackOff
      message: {{ printf "back-off 5m0s restarting failed container=%%s" .name | Quote }}
{{ end }}
phase: Running
"""
)

POD_FAIL_TEMPLATE = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  reason: PodFailed
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  reason: PodFailed
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  state:
    terminated:
      exitCode: 1
      reason: Error
      startedAt: {{ or $.status.startTime $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Failed
"""

POD_COMPLETE_TEMPLATE = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  reason: PodCompleted
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  reason: PodCompleted
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ or $.status.startTime $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ range .env }}{{ if eq .name "SIM_EVAL_SCORE" }}      message: {{ printf `{"score": %s}` .value | Quote }}
{{ end }}{{ end }}
{{ end }}
phase: Succeeded
"""


def build_stages(
    *,
    kube_version: str,
    kwok_version: str,
    load_delay_s: float = 0.0,
    load_jitter_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Every Stage of a Tandem dev cluster (pure). Order is irrelevant to KWOK; kept stable for diffs.

    ``load_delay_s``/``load_jitter_s`` are the cluster defaults for the Ready delay (model load); a
    pod overrides them with its annotations.
    """
    if load_delay_s < 0 or load_jitter_s < 0:
        raise ValueError("load delay and jitter must be >= 0")
    versions = {"kube_version": kube_version, "kwok_version": kwok_version}
    node_ready_true = _jq('.status.conditions.[] | select( .type == "Ready" ) | .status', "In", ["True"])
    return [
        _stage(
            "tandem-node-initialize",
            "Node",
            [_jq('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", ["True"])],
            [_status_patch(NODE_INITIALIZE_TEMPLATE % versions)],
        ),
        _stage(
            "tandem-node-heartbeat",
            "Node",
            [_jq(".status.phase", "In", ["Running"]), node_ready_true],
            [_status_patch(NODE_HEARTBEAT_TEMPLATE)],
            delay={
                "durationMilliseconds": NODE_HEARTBEAT_MS,
                "jitterDurationMilliseconds": NODE_HEARTBEAT_MS + NODE_HEARTBEAT_MS // 10,
            },
        ),
        _stage(
            "tandem-pod-start",
            "Pod",
            [_NOT_DELETED, _jq(".status.phase", "In", ["Pending"])],
            [_status_patch(POD_START_TEMPLATE)],
        ),
        _stage(
            "tandem-pod-ready",
            "Pod",
            [_NOT_DELETED, _jq(".status.phase", "In", ["Running"]), _READY_NOT_TRUE, _NO_SIM_FAIL, _NOT_CRASHLOOPING],
            [_status_patch(POD_READY_TEMPLATE)],
            delay={
                "durationMilliseconds": _ms(load_delay_s),
                "durationFrom": {"jq": {"expression": _seconds_expr(ANNOTATION_SIM_LOAD_SECONDS)}},
                "jitterDurationMilliseconds": _ms(load_delay_s + load_jitter_s),
                "jitterDurationFrom": {
                    "jq": {
                        "expression": _upper_bound_expr(
                            ANNOTATION_SIM_LOAD_SECONDS,
                            ANNOTATION_SIM_LOAD_JITTER_SECONDS,
                            load_delay_s,
                            load_jitter_s,
                        )
                    }
                },
            },
        ),
        _stage(
            "tandem-pod-crashloop",
            "Pod",
            [
                _NOT_DELETED,
                _jq(".status.phase", "In", ["Running"]),
                _jq(_annotation(ANNOTATION_SIM_FAIL), "In", [SIM_FAIL_CRASHLOOP]),
                _NOT_CRASHLOOPING,
            ],
            [
                {
                    "event": {
                        "type": "Warning",
                        "reason": "BackOff",
                        "message": "Back-off restarting failed container (simulated)",
                    }
                },
                _status_patch(POD_CRASHLOOP_TEMPLATE % {"restart_annotation": ANNOTATION_SIM_RESTART_COUNT}),
            ],
            delay={
                "durationMilliseconds": 1000,
                "durationFrom": {"jq": {"expression": _seconds_expr(ANNOTATION_SIM_FAIL_AFTER_SECONDS)}},
            },
        ),
        _stage(
            "tandem-pod-fail",
            "Pod",
            [
                _NOT_DELETED,
                _jq(".status.phase", "In", ["Running"]),
                _jq(_annotation(ANNOTATION_SIM_FAIL), "In", [SIM_FAIL_FAIL]),
            ],
            [
                {
                    "event": {
                        "type": "Warning",
                        "reason": "Failed",
                        "message": "Container exited with code 1 (simulated)",
                    }
                },
                _status_patch(POD_FAIL_TEMPLATE),
            ],
            delay={
                "durationMilliseconds": 1000,
                "durationFrom": {"jq": {"expression": _seconds_expr(ANNOTATION_SIM_FAIL_AFTER_SECONDS)}},
            },
        ),
        _stage(
            "tandem-pod-complete",
            "Pod",
            [
                _NOT_DELETED,
                _jq(".status.phase", "In", ["Running"]),
                _READY_TRUE,
                _NO_SIM_FAIL,
                _jq(".metadata.ownerReferences.[].kind", "In", ["Job"]),
            ],
            [_status_patch(POD_COMPLETE_TEMPLATE)],
            delay={
                "durationMilliseconds": 0,
                "durationFrom": {"jq": {"expression": _seconds_expr(ANNOTATION_SIM_RUN_SECONDS)}},
            },
        ),
        _stage(
            "tandem-pod-delete",
            "Pod",
            [
                _jq(".metadata.deletionTimestamp", "Exists"),
                _jq(_annotation(ANNOTATION_SIM_STRIP_FINALIZERS), "NotIn", ["true"]),
            ],
            [{"delete": True}],
        ),
        _stage(
            "tandem-pod-delete-strip-finalizers",
            "Pod",
            [
                _jq(".metadata.deletionTimestamp", "Exists"),
                _jq(_annotation(ANNOTATION_SIM_STRIP_FINALIZERS), "In", ["true"]),
            ],
            [{"finalizers": {"empty": True}}, {"delete": True}],
        ),
    ]
