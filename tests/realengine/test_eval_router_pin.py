"""`tandem eval` through `tandem router` pinned to the canary revision, against real prefill and decode engines
over NixlConnector: the eval Job's path when the operator knows a router (issue 16: "the eval Job's client
runs against the real engine through the router").

The rollout (tests/realengine/evalrouter.py) has a stable pair nobody listens on and the real engines as a
canary at 0 %: with the pin the eval scores the real engines' exact answers and the decode engine takes the
prompts from external KV transfer; without it the same eval scores 0, because nothing unpinned reaches the
canary. The expectations are one engine's answers alone, so 100 % of them also says the pinned P/D answer
equals single-engine serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tandem.routing import HEADER_REVISION
from tests.realengine import evalrouter
from tests.realengine.builtpods import BuiltEngine
from tests.realengine.engines import metric_value, post_json

pinned_router = evalrouter.pinned_router  # the module's fixture, registered here

# Unseen prompts (the other tests' engines keep a prefix cache), long enough to span several KV blocks.
PROMPTS = (
    "def rollout(pool, revision):\n    steps = pool.spec.rollout.steps\n" * 6,
    "The eval Job pinned the canary revision because",
)
MAX_TOKENS = 8


def _eval(router: str, served_name: str, headers: dict[str, str], dataset: Path, log: Path) -> dict[str, object]:
    env = {
        **os.environ,
        "TANDEM_TARGET_URLS": router,
        "TANDEM_MODEL": served_name,
        "TANDEM_TARGET": "router",
        "TANDEM_TARGET_HEADERS": json.dumps(headers),
    }
    argv = [sys.executable, "-m", "tandem.cli", "eval", "--dataset", str(dataset), "--runs", "2"]
    proc = subprocess.run(
        [*argv, "--termination-log", str(log)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_eval_client_scores_the_canary_through_the_router_with_the_revision_pin(
    pinned_router: evalrouter.PinnedRouter,
    prefill: BuiltEngine,
    decode: BuiltEngine,
    served_name: str,
    tmp_path: Path,
) -> None:
    cases = []
    for prompt in PROMPTS:
        alone = post_json(
            f"{prefill.engine.url}/v1/completions",
            {"model": served_name, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
        )
        cases.append({"prompt": prompt, "expected": alone["choices"][0]["text"], "max_tokens": MAX_TOKENS})
    cases.append({"prompt": PROMPTS[1], "expected": "certainly not this", "max_tokens": MAX_TOKENS})
    dataset = tmp_path / "cases.jsonl"
    dataset.write_text("".join(json.dumps(c) + "\n" for c in cases))

    before = metric_value(decode.engine.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    pinned = _eval(pinned_router.url, served_name, {HEADER_REVISION: pinned_router.pin}, dataset, tmp_path / "log")
    after = metric_value(decode.engine.metrics(), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    assert pinned == {"score": 66.67, "total": 6, "matched": 4, "errors": 0}
    assert json.loads((tmp_path / "log").read_text()) == {"score": 66.67}
    assert after > before  # the decode engine took the prompts' KV from the prefill engine: the P/D path

    unpinned = _eval(pinned_router.url, served_name, {}, dataset, tmp_path / "log-unpinned")
    assert unpinned == {"score": 0.0, "total": 6, "matched": 0, "errors": 6}
