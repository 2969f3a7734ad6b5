"""Checks on a request's body as the client sent it, before vLLM reads it. `vllm serve` installs this ASGI middleware
(NeuronPlatform.pre_register_and_update adds it to --middleware's default); other requests pass through untouched.

- Completions and chat: vLLM's chat completions set prompt_logprobs = top_logprobs (0 unless given) whenever `echo`
  is on, so in SamplingParams a chat `echo` without logprobs and an explicit `"prompt_logprobs": 0` look the same.
  On an artifact without prompt_logits graphs the first must be served (request_checks drops its implied 0) and the
  second refused like any other prompt_logprobs: only the request body tells them apart.
- /v1/load_lora_adapter and SageMaker's /adapters (vLLM registers both when runtime LoRA updating is on): an adapter
  the export cannot hold is answered 400 here (adapter_checks.py); past this point vLLM answers any engine refusal
  with 500.
"""

from __future__ import annotations

import json
from collections.abc import Callable

MIDDLEWARE = "optimum_neuron_plugin.vllm.engine.http_checks.RequestBodyChecks"
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
# The adapter-load routes and their body's (name, path) fields: vLLM's own, and SageMaker's, which vLLM maps onto it
# (entrypoints/serve/lora/api_router.py: name <- body.name, path <- body.src).
LOAD_ADAPTER_FIELDS = {"/v1/load_lora_adapter": ("lora_name", "lora_path"), "/adapters": ("name", "src")}

# A request body -> the refusal's message, or None to let vLLM serve it; with the parameter it names.
Check = tuple[str, Callable[[bytes], str | None]]


def add_http_checks(parser) -> None:
    """Add the middleware to `vllm serve`'s --middleware default (a user's --middleware values are appended)."""
    current = parser.get_default("middleware")
    if current is not None and MIDDLEWARE not in current:
        parser.set_defaults(middleware=[*current, MIDDLEWARE])


class RequestBodyChecks:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        check = _check_of(scope)
        if check is None:
            return await self.app(scope, receive, send)
        param, refusal_of = check
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: vLLM sees it as it would have
                return await self.app(scope, _replay(b"", message, receive), send)
            body, more = body + message.get("body", b""), message.get("more_body", False)
        refusal = refusal_of(body)
        if refusal is None:
            return await self.app(scope, _replay(body, None, receive), send)
        content = json.dumps(
            {"error": {"message": refusal, "type": "BadRequestError", "param": param, "code": 400}}
        ).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": content})


def _check_of(scope) -> Check | None:
    """The check of this request's body, if the artifact needs one."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    from vllm.platforms import current_platform

    limits = getattr(current_platform, "serving_limits", None)
    if limits is None:
        return None
    if scope["path"] in COMPLETION_PATHS and not limits.prompt_logprobs:
        return "prompt_logprobs", _prompt_logprobs_refusal
    fields = LOAD_ADAPTER_FIELDS.get(scope["path"])
    if fields is not None and limits.lora_artifact is not None:
        from .adapter_checks import load_refusal  # reads the export's config: only where adapters are served

        artifact = limits.lora_artifact
        return fields[1], lambda body: load_refusal(artifact, body, *fields)
    return None


def _prompt_logprobs_refusal(body: bytes) -> str | None:
    from .request_checks import prompt_logprobs_refusal

    try:
        asked = json.loads(body).get("prompt_logprobs")
    except (ValueError, AttributeError):  # not a JSON object: vLLM answers it
        return None
    return prompt_logprobs_refusal(asked) if isinstance(asked, int) and not isinstance(asked, bool) else None


def _replay(body: bytes, first: dict | None, receive):
    """The request's body once (or the message that ended it), then the client's own messages (disconnects)."""
    pending = [first or {"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed
