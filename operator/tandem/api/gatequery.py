"""Rendering a metric gate's PromQL: the fixed variable set and where each variable may stand.

What it owns: :func:`render_query` and its rules (documented in ``tandem.core.promql``, which
re-exports everything here). It lives in the API package so that ``tandem validate`` can refuse a
custom query that would fail to render at run time (an unknown ``${name}``, a Grafana-style ``$pool``,
``${pool}`` outside a quoted matcher) with the same code the operator runs. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

GateRole = Literal["prefill", "decode", "any"]
ROLE_REGEX: Final[Mapping[str, str]] = {"prefill": "prefill", "decode": "decode", "any": "prefill|decode"}

VARIABLES: Final[tuple[str, ...]] = ("pool", "namespace", "revision", "role", "interval")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label (pool, namespace)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # revision
PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
# What the CRD checks of a custom query (a regular language): every `$` starts a known `${name}` or is not
# followed by `{`, a letter or `_`. Where a variable may stand (inside a quoted matcher) is checked by
# render_query only: `tandem validate` and the operator, not the API server.
QUERY_VARIABLES_PATTERN = r"^([^$]|\$\{(" + "|".join(VARIABLES) + r")\}|\$($|[^{A-Za-z_]))*$"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_REGEX_META = set(r"\.+*?()|[]{}^$")


class QueryRenderError(ValueError):
    """A query cannot be rendered: unknown or misplaced variable, bad value, or no query at all."""


@dataclass(frozen=True)
class QueryVars:
    """Values of the query variables for one revision."""

    namespace: str
    pool: str
    revision: str
    role: GateRole = "any"
    interval: str = "1m"
    """Range of ``rate()`` windows, a Prometheus duration; see :func:`compute_rate_window`."""


def _regex_escape(value: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in value)


def _string_escape(value: str, quote: str) -> str:
    if quote == "`":
        if "`" in value:
            raise QueryRenderError("a variable value inside a `raw string` cannot contain a backtick")
        return value
    out = value.replace("\\", "\\\\").replace(quote, "\\" + quote)
    return out.replace("\n", "\\n").replace("\r", "\\r")


def _check_values(variables: QueryVars) -> dict[str, str]:
    if not _NAME.match(variables.namespace) or len(variables.namespace) > 63:
        raise QueryRenderError(f"namespace {variables.namespace!r} is not a Kubernetes name")
    if not _NAME.match(variables.pool) or len(variables.pool) > 63:
        raise QueryRenderError(f"pool {variables.pool!r} is not a Kubernetes name")
    if not _LABEL_VALUE.match(variables.revision) or len(variables.revision) > 63:
        raise QueryRenderError(f"revision {variables.revision!r} is not a label value")
    if variables.role not in ROLE_REGEX:
        raise QueryRenderError(f"role {variables.role!r} is not prefill, decode or any")
    if not PROM_DURATION.match(variables.interval):
        raise QueryRenderError(f"interval {variables.interval!r} is not a Prometheus duration such as 30s or 1m")
    return {
        "namespace": variables.namespace,
        "pool": variables.pool,
        "revision": variables.revision,
        "role": ROLE_REGEX[variables.role],
        "interval": variables.interval,
    }


def render_query(text: str, variables: QueryVars) -> str:
    """Substitute ``${...}`` variables in ``text``; raise :class:`QueryRenderError` on any misuse.

    A small scanner tracks PromQL strings (``"..."``, ``'...'``, backticks) and ``#`` comments, so each
    placeholder is escaped for the place it sits in (see the module docstring for the rules).
    """
    if not text or not text.strip():
        raise QueryRenderError("the query is empty")
    values = _check_values(variables)
    out: list[str] = []
    i, n = 0, len(text)
    quote: str | None = None  # the open string's quote character
    regex_string = False  # the open string is the value of a =~ or !~ matcher
    while i < n:
        ch = text[i]
        if ch == "$":
            m = _PLACEHOLDER.match(text, i)
            if m is not None:
                out.append(_substitute(m.group(1), values, quote, regex_string))
                i = m.end()
                continue
            if text.startswith("${", i):
                raise QueryRenderError(f"malformed variable at offset {i}: {text[i : i + 20]!r}; write ${{name}}")
            if i + 1 < n and (text[i + 1].isalpha() or text[i + 1] == "_"):
                raise QueryRenderError(f"write variables as ${{name}}, not {text[i : i + 12]!r}")
            out.append(ch)
            i += 1
            continue
        if quote is None:
            if ch == "#":  # a comment runs to the end of the line
                end = text.find("\n", i)
                end = n if end < 0 else end
                out.append(text[i:end])
                i = end
                continue
            if ch in "\"'`":
                quote = ch
                regex_string = re.search(r"[=!]~\s*$", text[:i]) is not None
        elif ch == "\\" and quote != "`" and i + 1 < n:
            out.append(text[i : i + 2])  # an escape pair: never ends the string
            i += 2
            continue
        elif ch == quote:
            quote = None
        out.append(ch)
        i += 1
    if quote is not None:
        raise QueryRenderError("unterminated string in the query")
    return "".join(out)


def _substitute(name: str, values: Mapping[str, str], quote: str | None, regex_string: bool) -> str:
    if name not in values:
        raise QueryRenderError(
            f"unknown variable ${{{name}}}; the variables are " + ", ".join(f"${{{v}}}" for v in VARIABLES)
        )
    value = values[name]
    if name == "interval":
        return _string_escape(value, quote) if quote else value
    if quote is None:
        example = 'role=~"${role}"' if name == "role" else f'{name}="${{{name}}}"'
        raise QueryRenderError(f"${{{name}}} must be inside a quoted label matcher value, e.g. {example}")
    if name == "role":
        if not regex_string:
            raise QueryRenderError('${role} is a regex (prefill|decode for any): use it as role=~"${role}"')
        return _string_escape(value, quote)
    return _string_escape(_regex_escape(value) if regex_string else value, quote)
