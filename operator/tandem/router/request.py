"""What the router reads from an OpenAI request body before it routes it.

Owns: the routing text (what the prefix key is taken over), the prompt-token estimate that classifies the
request into a pool, whether it carries images, and whether the client asked for a stream. Pure: no I/O.

Routing text. ``/v1/completions``: the prompt string (a list of prompts: the first one; token-id prompts:
the ids as decimal text joined by ","). ``/v1/chat/completions``: the text parts of the messages in order,
each as ``role + "\\n" + text`` joined by ``"\\n"``; a chat template puts the system prompt and the first
turns first too, so equal conversation prefixes give equal keys.

Token estimate (classification only, never billing): ``ceil(utf8_bytes / 4)`` of the routing text, plus
:data:`IMAGE_TOKEN_ESTIMATE` per image part; token-id prompts are counted exactly. Measured error
(``tools/token_estimate_error.py``, ``docs/design/008-router.md``), median and p5..p95 against a 131k-vocab
tokenizer (Mistral Tekken): prose −15 % (−32 %..0 %), Python −5 % (−22 %..+8 %), indented YAML/JSON +28 %
(+4 %..+63 %); a 2k-vocab tokenizer runs ≈ 40 % under. CJK is unmeasured (expected 0-50 % high), and the
chat template's few tokens per message are omitted. Pool bounds should therefore have ≥ 30 % slack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from tandem.routing import RequestFeatures

BYTES_PER_TOKEN: Final = 4
IMAGE_TOKEN_ESTIMATE: Final = 1024
"""A 1024-token allowance per image: the order of a 1-megapixel image in common vision encoders."""

KIND_COMPLETION = "completion"
KIND_CHAT = "chat"


class BadRequest(ValueError):
    """The body cannot be routed; the message is shown to the client."""


@dataclass(frozen=True)
class ClientRequest:
    """A parsed client request: its body (unchanged) and what routing needs from it."""

    kind: str
    body: Mapping[str, Any]
    routing_text: str
    prompt_tokens: int
    has_images: bool
    stream: bool
    model: str | None

    def features(self, headers: Mapping[str, str]) -> RequestFeatures:
        """The classification input of :func:`tandem.routing.classify`."""
        return RequestFeatures(prompt_tokens=self.prompt_tokens, has_images=self.has_images, headers=headers)


def estimate_tokens(text: str) -> int:
    """``ceil(utf8 bytes / 4)``: the documented estimator (module docstring for its error)."""
    n = len(text.encode("utf-8", "surrogatepass"))
    return -(-n // BYTES_PER_TOKEN)


def _prompt_text(prompt: Any) -> tuple[str, int | None]:
    """(routing text, exact token count when the prompt is token ids)."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if all(isinstance(t, int) for t in prompt):
            return ",".join(str(t) for t in prompt), len(prompt)
        if isinstance(first, str):
            return first, None
        if isinstance(first, list) and all(isinstance(t, int) for t in first):
            return ",".join(str(t) for t in first), len(first)
    raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")


def _chat_text(messages: Any) -> tuple[str, int]:
    """(routing text, image parts) of a chat ``messages`` list."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    parts: list[str] = []
    images = 0
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        role = str(message.get("role", ""))
        content = message.get("content")
        texts: list[str] = []
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind in {"image_url", "input_image", "image"}:
                    images += 1
        parts.append(role + "\n" + "".join(texts))
    return "\n".join(parts), images


def parse_request(kind: str, body: Any) -> ClientRequest:
    """Read the routing inputs of a ``completion`` or ``chat`` body; :class:`BadRequest` if unusable."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if kind == KIND_CHAT:
        text, images = _chat_text(body.get("messages"))
        tokens = estimate_tokens(text) + images * IMAGE_TOKEN_ESTIMATE
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        text, exact = _prompt_text(body["prompt"])
        images = 0
        tokens = exact if exact is not None else estimate_tokens(text)
    return ClientRequest(
        kind=kind,
        body=body,
        routing_text=text,
        prompt_tokens=tokens,
        has_images=images > 0,
        stream=bool(body.get("stream", False)),
        model=model,
    )


MIRROR_ID_SUFFIX: Final = "-mirror"
"""A mirror copy's request id is its request's id with this suffix (engines and their logs can tell copies)."""


def mirror_request(creq: ClientRequest) -> ClientRequest:
    """The copy of ``creq`` a mirrored canary pair gets: the same body with ``stream`` off (and no
    ``stream_options``), so its whole answer is read in one piece and dropped. The engine measures its TTFT,
    TPOT and errors the same way streamed or not; only the router's relay differs."""
    body = {k: v for k, v in creq.body.items() if k not in ("stream", "stream_options")}
    return replace(creq, body=body, stream=False)
