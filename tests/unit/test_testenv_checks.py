"""The build scripts' output checks (tools/testenv/checks.sh) are immune to SIGPIPE.

On a fresh machine `tools/testenv/build.sh` failed 3 of 20 etcd builds: `etcd --version | grep -q ...`
under `set -o pipefail` exits 141 when grep quits at its first match while etcd still writes. These tests
run the checks against a "binary" that prints its version and then a lot more, and show that the old
pattern fails where the helpers pass; a lint test keeps the pattern out of every script in tools/.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKS = REPO / "tools" / "testenv" / "checks.sh"


@pytest.fixture
def chatty(tmp_path: Path) -> Path:
    """Prints the version line first, then 2 MiB more: far past any pipe buffer (64 KiB)."""
    script = tmp_path / "chatty"
    script.write_text(
        "#!/usr/bin/env bash\n"
        "echo 'etcd Version: 3.6.14'\n"
        "echo 'Kubernetes v1.34.4'\n"
        "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        " | head -n 20000\n"
    )
    script.chmod(0o755)
    return script


def bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n. {CHECKS}\n{script}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_old_pipe_pattern_fails_on_a_chatty_binary(chatty: Path) -> None:
    """The hazard itself: the check matched, yet the pipeline fails with SIGPIPE's 141."""
    proc = bash(f"{chatty} | grep -q 'etcd Version: 3.6.14'")
    assert proc.returncode == 141


@pytest.mark.parametrize(
    ("check", "want_rc"),
    [
        pytest.param("output_has 'etcd Version: 3.6.14' {b}", 0, id="contains: match"),
        pytest.param("output_has 'etcd Version: 9.9.9' {b}", 1, id="contains: no match"),
        pytest.param("output_has_line 'Kubernetes v1.34.4' {b}", 0, id="whole line: match"),
        pytest.param("output_has_line 'Kubernetes v1.34' {b}", 1, id="whole line: prefix is not a line"),
        pytest.param("output_has_prefix 'Kubernetes v1.34' {b}", 0, id="prefix: match"),
        pytest.param("output_has_prefix 'v1.34' {b}", 1, id="prefix: middle of a line"),
        pytest.param("output_has 'anything' false", 1, id="a failing command fails the check"),
        pytest.param("[ \"$(first_line {b})\" = 'etcd Version: 3.6.14' ]", 0, id="first line"),
    ],
)
def test_checks_decide_on_the_output_alone(chatty: Path, check: str, want_rc: int) -> None:
    for _ in range(3):  # SIGPIPE is a race: a pass must not be luck
        proc = bash(check.format(b=chatty))
        assert proc.returncode == want_rc, proc.stderr[-500:]


def test_checks_read_files_without_pipes(tmp_path: Path) -> None:
    mod = tmp_path / "go.mod"
    mod.write_text("module x\n\nrequire go.etcd.io/etcd/server/v3 v3.6.14\n")
    assert bash(f"file_has 'go.etcd.io/etcd/server/v3 v3.6.14' {mod}").returncode == 0
    assert bash(f"file_has 'v3.6.15' {mod}").returncode == 1
    assert bash(f"file_has 'x' {tmp_path / 'missing'}").returncode == 1


PIPE_INTO_EARLY_EXIT = re.compile(r"\|\s*(grep\s+(-\w*q|--quiet)|head\b)")


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=str(p.relative_to(REPO))) for p in [*sorted((REPO / "tools").rglob("*.sh")), REPO / ".ci/run"]],
)
def test_no_script_pipes_into_a_reader_that_exits_early(path: Path) -> None:
    """`| grep -q` and `| head` end the reader before the writer: under pipefail that is a random 141."""
    offending = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PIPE_INTO_EARLY_EXIT.search(line) and not line.lstrip().startswith("#")
    ]
    assert not offending, "\n".join(offending)
