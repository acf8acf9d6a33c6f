"""Event and condition reasons: declared once as constants, CamelCase, and the only ones the product emits.

Users' alerts match on reasons, so the vocabulary is a contract: these tests fail when product code writes
a reason as a literal (a typo would ship silently), when a declared reason is not CamelCase (the
Kubernetes convention), or when a pass emits a reason that no vocabulary module declares.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tandem.api.revision import revision_id, revision_spec
from tandem.core import analysis, autoscale, conditions, gates, mooncake, reasons
from tandem.core.plan import Plan
from tests.support.factories import PoolBuilder, World, make_nodes, make_pool

REPO = Path(__file__).resolve().parents[3]
PRODUCT = REPO / "operator" / "tandem"

VOCABULARIES: tuple[ModuleType, ...] = (conditions, reasons, gates, autoscale, analysis, mooncake)
"""Every module that owns reasons written to Events or status conditions."""

KUBERNETES_REASONS = frozenset({"CrashLoopBackOff", "Unschedulable"})
"""Reasons Kubernetes itself writes (a container's waiting state, PodScheduled) that the observer reads."""

CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def declared(prefix: str) -> dict[str, str]:
    """`module.NAME` -> value for every constant named `<prefix>*` in the vocabulary modules."""
    out: dict[str, str] = {}
    for module in VOCABULARIES:
        for name, value in vars(module).items():
            if name.startswith(prefix) and isinstance(value, str):
                out[f"{module.__name__}.{name}"] = value
    return out


DECLARED_REASONS = frozenset(declared("REASON_").values())


@pytest.mark.parametrize("prefix", [pytest.param("REASON_", id="reasons"), pytest.param("CONDITION_", id="types")])
def test_vocabulary_is_camel_case(prefix: str) -> None:
    constants = declared(prefix)
    assert constants, f"no {prefix}* constants found: the vocabulary moved?"
    bad = {name: value for name, value in constants.items() if not CAMEL_CASE.match(value)}
    assert not bad, f"not CamelCase: {bad}"


def spelled(module: ModuleType) -> list[str]:
    """Values of the module's own `REASON_X = "Literal"` declarations (aliases of another module's skipped)."""
    assert module.__file__ is not None
    out = []
    for node in ast.parse(Path(module.__file__).read_text()).body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and target.id.startswith("REASON_")
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            out.append(value.value)
    return out


def test_each_reason_is_spelled_once() -> None:
    """One word, one constant: an Event that reports a condition's reason reuses that condition's constant."""
    values = [value for module in VOCABULARIES for value in spelled(module)]
    assert len(values) > 50, "declarations not found: the vocabulary moved?"
    twice = sorted({v for v in values if values.count(v) > 1})
    assert not twice, f"declared as a literal in more than one place: {twice}"


# --- static: no literal reason in product code --------------------------------------------------------


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """String constants that can flow out of an expression (through `a if c else b` and `a or b`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _strings(value)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _strings(element)


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_reason(node: ast.AST) -> bool:
    """`reason`, `x.reason`, `failed_reason`, or `d.get("reason")`: an expression holding a reason."""
    if "reason" in _name(node).lower():
        return True
    return (
        isinstance(node, ast.Call)
        and _name(node.func) == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "reason"
    )


def reason_literals(tree: ast.AST) -> Iterator[tuple[str, ast.Constant]]:
    """(how it is used, literal) for every string literal the code uses as a reason.

    Written: the reason of `Event(type, reason, message)` and of `set_condition(..., reason, ...)`, a
    `reason=` keyword, an assignment to a `*reason*` variable. Read: a comparison with a reason. CEL rule
    reasons (`Rule(..., reason=...)`) are Kubernetes' own `FieldValue*` enum, not ours: skipped.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _name(node.func)
            if func == "Rule":
                continue
            if func == "Event" and len(node.args) >= 2:
                yield from (("written", s) for s in _strings(node.args[1]))
            if func == "set_condition" and len(node.args) >= 4:
                yield from (("written", s) for s in _strings(node.args[3]))
            for kw in node.keywords:
                if kw.arg and "reason" in kw.arg.lower():
                    yield from (("written", s) for s in _strings(kw.value))
        elif isinstance(node, ast.Assign) and any("reason" in _name(t).lower() for t in node.targets):
            if not all(_name(t).isupper() for t in node.targets):  # REASON_X = "..." is the declaration
                yield from (("written", s) for s in _strings(node.value))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_reason(x) for x in operands):
                for x in operands:
                    yield from (("read", s) for s in _strings(x))


def product_reason_literals() -> list[tuple[str, str, str]]:
    """(path:line, how, value) of every reason-like literal in the product, CamelCase values only.

    Only CamelCase literals are reason-shaped: `""` (no reason yet) and message fallbacks such as
    `"not ready yet"` are not reasons.
    """
    out = []
    for path in sorted(PRODUCT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for how, node in reason_literals(tree):
            if CAMEL_CASE.match(node.value):
                out.append((f"{path.relative_to(REPO)}:{node.lineno}", how, node.value))
    return out


def test_product_never_writes_a_literal_reason() -> None:
    written = [f"{where}: {value!r}" for where, how, value in product_reason_literals() if how == "written"]
    assert not written, (
        "reasons written as literals (declare a REASON_* constant in the owning vocabulary, see "
        "tandem/core/reasons.py):\n" + "\n".join(written)
    )


def test_reasons_the_product_reads_are_declared() -> None:
    """A reader that compares with a reason (e.g. `tandem rollout status`) must name one that exists."""
    read = [(where, value) for where, how, value in product_reason_literals() if how == "read"]
    known = DECLARED_REASONS | KUBERNETES_REASONS
    unknown = [f"{where}: {value!r}" for where, value in read if value not in known]
    assert not unknown, "compared with a reason no vocabulary declares:\n" + "\n".join(unknown)


@pytest.mark.parametrize(
    ("source", "want"),
    [
        pytest.param('Event(EVENT_NORMAL, "PairsCreated", "m")', ["written"], id="event positional"),
        pytest.param('set_condition(cs, "Ready", "True", "AllGood", "m", now, 1)', ["written"], id="condition"),
        pytest.param('Condition(type="Ready", reason="AllGood")', ["written"], id="keyword"),
        pytest.param('reason = "A" if x else "B"', ["written", "written"], id="assigned either way"),
        pytest.param('REASON_X = "Declared"', [], id="declaration"),
        pytest.param('Rule("self == oldSelf", "m", reason="FieldValueForbidden")', [], id="CEL rule reason"),
        pytest.param('ok = ready.get("reason") != "ScaledToZero"', ["read"], id="read"),
        pytest.param("Event(EVENT_NORMAL, REASON_PAIRS_CREATED, m)", [], id="constant"),
    ],
)
def test_reason_literal_scanner(source: str, want: list[str]) -> None:
    """The scanner itself: a check that could never find anything would pass forever."""
    assert [how for how, _ in reason_literals(ast.parse(source))] == want


# --- dynamic: reasons a pass emits ----------------------------------------------------------------------


def _rollout(steps: list[dict[str, Any]], **rollout: Any) -> tuple[World, PoolBuilder]:
    builder = make_pool().pairs(3).steps(*steps).rollout(**rollout)
    world = World(builder.obj(), make_nodes(6))
    world.run_until(lambda w: w.ready_pairs() == 3)
    return world, builder


def _phase(world: World) -> str:
    assert world.pool.status is not None
    return world.pool.status.rollout.phase


def _annotate(world: World, key: str, value: str) -> None:
    meta = world.pool.metadata.model_copy(update={"annotations": {key: value}})
    world.pool = world.pool.model_copy(update={"metadata": meta})


def scenario_promote_paused_and_resumed() -> World:
    world, builder = _rollout([{"setCanaryPairs": 1}, {"pause": {"duration": "10s"}}, {"setWeight": 100}])
    world.set_spec(builder.version("v2").rollout(paused=True))
    for _ in range(3):
        world.tick()
    world.set_spec(builder.rollout(paused=False))
    world.run_until(lambda w: _phase(w) == "Promoted")
    world.set_spec(builder.pairs(1))
    world.run_until(lambda w: len(w.pods) == 2, seconds=60)
    return world


def scenario_abort_and_ignored_abort() -> World:
    world, builder = _rollout([{"setCanaryPairs": 1}, {"pause": {}}])
    _annotate(world, "tandem.dev/abort", "a1")
    world.tick()
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    _annotate(world, "tandem.dev/abort", "a2")
    world.run_until(lambda w: _phase(w) == "RolledBack", seconds=10)
    return world


def scenario_never_ready_canary() -> World:
    world, builder = _rollout([{"setCanaryPairs": 1}, {"setWeight": 100}], progressDeadline="60s")
    world.set_spec(builder.version("bad"))
    world.never_ready.add(revision_id(revision_spec(world.pool.spec)))
    world.run_until(lambda w: _phase(w) in ("RolledBack", "Promoted"), max_ticks=80, seconds=10)
    return world


def scenario_promote_request_and_restart() -> World:
    world, builder = _rollout([{"setCanaryPairs": 1}, {"pause": {}}, {"setWeight": 100}])
    world.set_spec(builder.version("v2"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    world.set_spec(builder.version("v3"))
    world.run_until(lambda w: w.pool.status is not None and w.pool.status.rollout.step_index == 1)
    _annotate(world, "tandem.dev/promote", "p1")
    world.run_until(lambda w: _phase(w) == "Promoted")
    return world


def emitted(plans: list[Plan]) -> set[str]:
    return {e.reason for plan in plans for e in plan.events}


@pytest.mark.parametrize(
    ("scenario", "want_some"),
    [
        pytest.param(scenario_promote_paused_and_resumed, {"RolloutPaused", "RolloutResumed", "Promoted"}, id="pause"),
        pytest.param(scenario_abort_and_ignored_abort, {"AbortIgnored", "AbortRequested", "RolledBack"}, id="abort"),
        pytest.param(scenario_never_ready_canary, {"ProgressDeadlineExceeded", "RolledBack"}, id="deadline"),
        pytest.param(scenario_promote_request_and_restart, {"RolloutRestarted", "PromoteRequested"}, id="promote"),
    ],
)
def test_every_reason_a_pass_emits_is_declared(scenario: Callable[[], World], want_some: set[str]) -> None:
    world = scenario()
    reasons_seen = emitted(world.plans)
    assert want_some <= reasons_seen, f"scenario did not reach {sorted(want_some - reasons_seen)}"
    assert reasons_seen <= DECLARED_REASONS, f"undeclared: {sorted(reasons_seen - DECLARED_REASONS)}"
    assert world.pool.status is not None
    condition_reasons = {cond.reason for cond in world.pool.status.conditions}
    assert condition_reasons <= DECLARED_REASONS, f"undeclared: {sorted(condition_reasons - DECLARED_REASONS)}"
