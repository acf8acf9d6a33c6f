"""`make demo` is the README's first command: its story runs in the suite (`tandem demo --ci`).

The CI-sized run is the same story on its own cluster (demo-ci, started fresh and torn down): the
reference fleet comes up, the trace's requests go through `tandem router` to engine doubles, load
scales the speed pool, v33 is promoted and v34 rolled back, by the operator alone. A demo that
breaks fails `make test`, not the first person who tries it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem_lab.dev.testenv import Toolchain

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / ".logs" / "demo-ci.log"
BUDGET_S = 1500


@pytest.mark.timeout(BUDGET_S + 120)
def test_the_demo_story_runs_end_to_end(toolchain: Toolchain) -> None:
    LOG.parent.mkdir(exist_ok=True)
    started = time.monotonic()
    with LOG.open("w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "demo", "--ci"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout=BUDGET_S,
            check=False,
        )
    took = time.monotonic() - started
    out = LOG.read_text(errors="replace")
    print(f"tandem demo --ci: exit {proc.returncode} in {took:.0f} s (log: {LOG})")
    assert proc.returncode == 0, out[-4000:]
    for line in (
        "traffic flows through tandem router",  # the default since the data plane (issue 15 item 8)
        "fleet Ready",
        "speed scaled to",
        "v33 promoted in",
        "v34 rolled back in",
    ):
        assert line in out, f"the demo never said {line!r}:\n{out[-4000:]}"
    assert "Traceback" not in out, out[-4000:]
