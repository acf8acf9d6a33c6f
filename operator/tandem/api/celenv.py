"""Offline evaluation of the CRDs' CEL rules, with the Kubernetes CEL library functions they use.

What it owns: compiling and evaluating ``x-kubernetes-validations`` rules with cel-python, plus the
Kubernetes extensions our rules call (``isSorted``, ``isURL``/``url().getScheme()``,
``quantity().isLessThan()``...). Standard CEL (``has``, ``all``, ``filter``, ``map``, ``matches``,
``duration``, ``size``) comes from cel-python itself. Compiled programs are cached by rule text.

Also used to evaluate the canary gates' ``successCondition``/``failureCondition`` expressions, so
one CEL dialect serves admission and analysis.

Invariant: a rule that raises during evaluation counts as *not satisfied* (the API server reports an
evaluation error as a rejection too); a rule that does not compile is a programming error and raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import celpy
import re2  # type: ignore[import-untyped]  # google-re2, celpy's own engine: RE2 semantics, like Go's regexp
from celpy import celtypes
from celpy.adapter import json_to_cel

from tandem.api.quantity import parse_duration_ns, parse_quantity

logging.getLogger("celpy").setLevel(logging.CRITICAL)


class _Quantity:
    """Result of ``quantity(s)``: compared exactly, as the Kubernetes library does."""

    def __init__(self, value: Fraction) -> None:
        self.value = value


class _Url:
    """Result of ``url(s)``."""

    def __init__(self, text: str) -> None:
        self.parts = urlsplit(text)


def _is_url(text: Any) -> celtypes.BoolType:
    try:
        parts = urlsplit(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(bool(parts.scheme) and (bool(parts.netloc) or parts.scheme in ("mailto", "urn")))


def _url(text: Any) -> _Url:
    if not _is_url(text):
        raise ValueError(f"not a URL: {text}")
    return _Url(str(text))


def _is_sorted(items: Any) -> celtypes.BoolType:
    values = list(items)
    return celtypes.BoolType(all(values[i] <= values[i + 1] for i in range(len(values) - 1)))


def _duration(value: Any) -> celtypes.DurationType:
    """``duration(s)`` with Go's range: beyond int64 nanoseconds it is an error, as in the API server."""
    if isinstance(value, str):
        parse_duration_ns(value)  # raises ValueError (an evaluation error) when out of Go's range
    return celtypes.DurationType(value)


def _quantity(text: Any) -> _Quantity:
    return _Quantity(parse_quantity(str(text)))


FUNCTIONS: dict[str, Any] = {
    "isSorted": _is_sorted,
    "isURL": _is_url,
    "url": _url,
    "getScheme": lambda u: celtypes.StringType(u.parts.scheme),
    "getHost": lambda u: celtypes.StringType(u.parts.netloc),
    "getHostname": lambda u: celtypes.StringType(u.parts.hostname or ""),
    "getEscapedPath": lambda u: celtypes.StringType(u.parts.path),
    "duration": _duration,
    "quantity": _quantity,
    "isQuantity": lambda s: celtypes.BoolType(_try_quantity(s)),
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
    "compareTo": lambda a, b: celtypes.IntType((a.value > b.value) - (a.value < b.value)),
    "asInteger": lambda q: celtypes.IntType(int(q.value)),
}


def _try_quantity(text: Any) -> bool:
    try:
        parse_quantity(str(text))
    except ValueError:
        return False
    return True


_ENV = celpy.Environment()


@lru_cache(maxsize=512)
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule), functions=FUNCTIONS)


def pattern_matches(pattern: str, text: str) -> bool:
    """A schema ``pattern`` as the API server applies it (Go's RE2): ``$`` is the end of the text, never
    "before a final newline" as in Python's ``re``, and ``\\s``/``\\d`` are ASCII only."""
    return re2.search(pattern, text) is not None


def compile_check(expression: str) -> str | None:
    """Return None when ``expression`` compiles, else the compiler's message."""
    try:
        _program(expression)
    except Exception as exc:
        return str(exc).splitlines()[0]
    return None


# What a gate's successCondition/failureCondition may read (core.gates evaluates them with these doubles).
CONDITION_VARIABLES = ("result", "baseline")

# The condition language the CRD admits: comparisons of arithmetic over result, baseline and decimal
# numbers (doubles only, so no int/double overload can fail), joined by && or ||. A regular language, so
# the API server checks it exactly with one `matches` (it cannot compile CEL held in a string), and every
# sentence of it compiles, reads only result/baseline and is boolean (tests/unit/api/test_celenv.py
# generates sentences and checks that). Design note 010, "Gate conditions at admission".
_SPACE = r"[ \t\r\n]*"  # not \s: Python's also matches Unicode spaces, Go's (the API server's) does not
_NUMBER = r"[0-9]+\.[0-9]+([eE][-+]?[0-9]+)?"
_OPERAND = rf"-?(result|baseline|{_NUMBER})"
_ARITH = rf"{_OPERAND}({_SPACE}[-+*/]{_SPACE}{_OPERAND})*"
_COMPARISON = rf"{_ARITH}{_SPACE}(<=|>=|==|!=|<|>){_SPACE}{_ARITH}"
CONDITION_PATTERN = rf"^{_SPACE}{_COMPARISON}({_SPACE}(&&|\|\|){_SPACE}{_COMPARISON})*{_SPACE}$"
CONDITION_GRAMMAR = (
    "comparisons (<, <=, >, >=, ==, !=) of result, baseline and decimal numbers such as 1.0, "
    "with + - * /, joined by && or ||"
)
_TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_SAMPLE = {"result": 1.0, "baseline": 1.0}


def _identifiers(tree: Any) -> tuple[set[str], set[str]]:
    """(identifiers read, variables bound by comprehension macros) in a compiled expression's tree."""
    read: set[str] = set()
    bound: set[str] = set()
    for node in tree.iter_subtrees():
        if node.data == "ident":
            read.add(str(node.children[0]))
        elif node.data == "member_dot_arg" and len(node.children) >= 3 and str(node.children[1]) in _MACROS:
            args = node.children[2]
            first = next(iter(args.children), None) if hasattr(args, "children") else None
            if first is not None:
                bound.update(str(sub.children[0]) for sub in first.iter_subtrees() if sub.data == "ident")
    return read, bound


def _type_name(value: Any) -> str:
    for kind, name in ((bool, "bool"), (int, "int"), (float, "double"), (str, "string"), (list, "list"), (dict, "map")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def condition_problem(expression: str) -> str | None:
    """Why a gate condition would fail at run time (None when it is fine): it does not parse, reads a
    variable other than ``result``/``baseline``, or does not evaluate to a boolean."""
    try:
        tree = _ENV.compile(expression)
    except Exception as exc:
        return "does not compile: " + " ".join(str(exc).split())[:200]
    read, bound = _identifiers(tree)
    unknown = sorted(read - bound - set(CONDITION_VARIABLES) - _TYPE_NAMES)
    if unknown:
        return f"unknown variable {unknown[0]!r}: a condition may read only result and baseline"
    try:
        value = evaluate(expression, _SAMPLE)
    except CelError as exc:
        if "by zero" in str(exc):
            return None  # depends on the data, not on the expression
        return "cannot be evaluated with result and baseline as numbers: " + " ".join(str(exc).split())[:200]
    except Exception as exc:
        return "cannot be evaluated: " + " ".join(str(exc).split())[:200]
    if not isinstance(value, celtypes.BoolType):
        return f"must be a boolean expression (it gives a {_type_name(value)})"
    return None


def to_cel(value: Any) -> Any:
    """A JSON-like Python value as CEL values."""
    return json_to_cel(value)


def evaluate(rule: str, variables: Mapping[str, Any]) -> Any:
    """Evaluate ``rule`` with plain-Python ``variables``; raise ``CelError`` on evaluation errors."""
    program = _program(rule)
    activation = {name: to_cel(value) for name, value in variables.items()}
    try:
        return program.evaluate(activation)
    except Exception as exc:
        raise CelError(str(exc).splitlines()[0]) from exc


def holds(rule: str, variables: Mapping[str, Any]) -> bool:
    """True only when ``rule`` evaluates to boolean true; evaluation errors count as false."""
    try:
        result = evaluate(rule, variables)
    except CelError:
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


class CelError(Exception):
    """A CEL expression failed to evaluate (missing field, division by zero, wrong type...)."""
