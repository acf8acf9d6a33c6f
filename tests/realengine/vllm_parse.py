"""Run `vllm serve` argument lists through vLLM's own parser and config (runs in the real-engine venv).

Why: a real start proves one command line per role, at a minute each; this proves every variant the
builders emit (other connectors, a MooncakeCache's MultiConnector) in seconds, through the same code
`vllm serve` runs before it loads a model: the serve parser, its validation, EngineArgs and the
engine config (which builds and checks the KVTransferConfig). Connectors whose libraries this machine
lacks (Mooncake) are only constructed at engine start, so parsing them here is what can be checked.

Input (stdin): a JSON object {name: [args after `vllm serve`]}. Output (stdout, last line): a JSON object
{name: null | "the error vLLM raised"}, and every warning vLLM logged goes to stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def check(argv: list[str]) -> str | None:
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    usage = io.StringIO()
    try:
        # `vllm serve MODEL` stores the positional as model_tag and copies it to --model; do the same.
        with contextlib.redirect_stderr(usage):
            args = parser.parse_args([f"--model={argv[0]}", *argv[1:]])
        validate_parsed_serve_args(args)
        AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except SystemExit as exc:  # argparse reports a rejected flag by exiting
        return f"argparse rejected the arguments (exit {exc.code}): {usage.getvalue().strip().splitlines()[-1:]}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


if __name__ == "__main__":
    variants = json.load(sys.stdin)
    print(json.dumps({name: check(argv) for name, argv in variants.items()}))
