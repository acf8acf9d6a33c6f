"""The admission bad-input catalog (tests/contract/bad_inputs/cases.yaml) as test parameters.

Shared by the offline test (tandem validate) and the contract test (the real API server), so both
check the very same manifests and expectations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BAD_INPUTS = ROOT / "tests" / "contract" / "bad_inputs"
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class BadInput:
    id: str
    title: str
    path: Path
    update: bool
    expect: tuple[tuple[str, str], ...]
    server: bool = True
    """False: only `tandem validate` refuses it (the API server would need a webhook or a
    ValidatingAdmissionPolicy); the contract test skips it and says why."""

    def documents(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.path.read_text(encoding="utf-8")) if d]

    @property
    def new(self) -> dict[str, Any]:
        return self.documents()[-1]

    @property
    def old(self) -> dict[str, Any] | None:
        docs = self.documents()
        return docs[0] if self.update else None


def load_cases() -> list[BadInput]:
    data = yaml.safe_load((BAD_INPUTS / "cases.yaml").read_text(encoding="utf-8"))
    return [
        BadInput(
            id=c["id"],
            title=c["title"],
            path=BAD_INPUTS / c["file"],
            update=c["update"],
            expect=tuple((e["field"], e["contains"]) for e in c["expect"]),
            server=c.get("server", True),
        )
        for c in data["cases"]
    ]


def case_params(*, updates_only: bool = False) -> list[Any]:
    return [pytest.param(c, id=f"{c.id} {c.title}") for c in load_cases() if c.update or not updates_only]


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))
