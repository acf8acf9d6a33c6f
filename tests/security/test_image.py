"""S-SUP-02 and S-POD-04 at the image level: the Dockerfile and its lock file, checked statically.

No image can be built here (no container engine), so these tests parse the Dockerfile: a minimal
non-root runtime base, a numeric USER, dependencies only from a fully hashed lock, bytecode compiled at
build time, and the `tandem run` entrypoint the chart relies on. The real image (read-only root,
probes) is exercised by the release smoke on a real cluster.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "requirements.lock"
DOCKERIGNORE = REPO / ".dockerignore"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instr in instructions():
        if instr[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instr)
    return result


def build_args() -> dict[str, str]:
    args = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
    return args


def lock_pins() -> dict[str, str]:
    matches = [PIN.match(line) for line in LOCK.read_text().splitlines()]
    return {m.group(1).lower().replace("_", "-"): m.group(2) for m in matches if m}


def test_final_stage_is_distroless_nonroot() -> None:
    final = stages()[-1]
    base = final[0][1]
    resolved = build_args().get(base.strip("${}"), base)
    assert resolved.startswith("gcr.io/distroless/python3-debian12:nonroot"), resolved
    assert not any(word == "RUN" for word, _ in final), "the runtime stage has no shell to RUN with"


def test_numeric_non_root_user_is_last() -> None:
    users = [rest for word, rest in stages()[-1] if word == "USER"]
    assert users == ["65532:65532"]
    assert all(part.isdigit() and int(part) != 0 for part in users[0].split(":"))


def test_entrypoint_is_tandem_run_exec_form() -> None:
    entry = [rest for word, rest in stages()[-1] if word == "ENTRYPOINT"]
    assert len(entry) == 1
    assert json.loads(entry[0]) == ["tandem", "run"]
    assert not [rest for word, rest in instructions() if word == "CMD"]


def test_dependencies_only_from_the_hashed_lock() -> None:
    runs = [rest for word, rest in instructions() if word == "RUN"]
    installs = [r for r in runs if re.search(r"\bpip\b.*\binstall\b", r)]
    assert installs, "no pip install"
    lock_install = [r for r in installs if "requirements.lock" in r]
    assert lock_install and all("--require-hashes" in r and "--only-binary=:all:" in r for r in lock_install)
    for r in installs:
        if "requirements.lock" not in r:
            # the tandem package itself: no dependencies, no index, no isolated build downloading tools
            assert "--no-deps" in r and "--no-index" in r and "--no-build-isolation" in r, r
    assert not [rest for word, rest in instructions() if word == "ADD"], "ADD can fetch URLs; use COPY"


def test_bytecode_compiled_at_build() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "compileall" in runs and "unchecked-hash" in runs
    env = " ".join(rest for word, rest in stages()[-1] if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_lock_pins_every_package_with_hashes() -> None:
    text = LOCK.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[1])
    pins = [b for b in blocks if PIN.match(b)]
    assert pins
    for block in pins:
        assert "--hash=sha256:" in block, block.splitlines()[0]
    assert "--find-links" not in text and "--index-url" not in text and "--extra-index-url" not in text


def test_lock_covers_the_runtime_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = lock_pins()
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} is a runtime dependency but not in requirements.lock (regenerate it)"
    for tool in ("setuptools", "wheel"):
        assert tool in pins, f"{tool} must be locked: the package is built without build isolation"


def test_lock_satisfies_the_lower_bounds() -> None:
    """A runtime dependency whose lower bound was raised past the lock's pin means the lock is stale."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = lock_pins()

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    for requirement in project["dependencies"]:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement)
        if m:
            name = m.group(1).lower().replace("_", "-")
            assert version(pins[name]) >= version(m.group(2)), f"{name} {pins[name]} < {m.group(2)}"


def test_build_context_is_minimal() -> None:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"]
    assert lines[0] == "*", "ignore everything, then allow what the Dockerfile copies"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for word, rest in instructions():
        if word == "COPY" and "--from" not in rest:
            copied.update(p.rstrip("/") for p in rest.split()[:-1])
    assert copied <= allowed, copied - allowed
