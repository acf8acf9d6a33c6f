"""The eval Job's client (`tandem eval`, the command an eval gate's Job can run) against real vLLM engines
through `tandem router` (issue 16): its score is exact, and a wrong expectation costs exactly its share.

The expectations are what one engine answers alone (greedy, the same request body the client sends), so a
score of 100 % for those cases also says the router's P/D answer equals single-engine serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import post_json

PROMPTS = ("def add(a, b):\n    return", "The canary was promoted because")
MAX_TOKENS = 8


def test_eval_client_scores_real_pd_answers_through_the_router(
    router: str, prefill: BuiltEngine, served_name: str, tmp_path: Path
) -> None:
    cases = []
    for prompt in PROMPTS:
        alone = post_json(
            f"{prefill.engine.url}/v1/completions",
            {"model": served_name, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
        )
        cases.append({"prompt": prompt, "expected": alone["choices"][0]["text"], "max_tokens": MAX_TOKENS})
    cases.append({"prompt": PROMPTS[0], "expected": "certainly not this", "max_tokens": MAX_TOKENS})
    dataset = tmp_path / "cases.jsonl"
    dataset.write_text("".join(json.dumps(c) + "\n" for c in cases))
    log = tmp_path / "termination-log"
    env = {**os.environ, "TANDEM_TARGET_URLS": router, "TANDEM_MODEL": served_name}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "eval",
            "--dataset",
            str(dataset),
            "--runs",
            "2",
            "--termination-log",
            str(log),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"score": 66.67, "total": 6, "matched": 4, "errors": 0}, proc.stderr
    assert json.loads(log.read_text()) == {"score": 66.67}
