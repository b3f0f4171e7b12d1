"""OpenAI's API shapes, without a web framework: request bodies checked into `GenerationRequest`s, responses and
stream chunks as dicts, and errors as `APIError` with OpenAI's error body.

Supported: /v1/completions (one prompt: a string or token ids) and /v1/chat/completions (text messages through
the checkpoint's chat template) with model, max_tokens (max_completion_tokens), temperature, top_p, top_k (an
extension, as other servers have it), stop, seed, stream, stream_options.include_usage; n, logprobs, echo,
best_of, penalties and logit_bias only at their defaults.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from typing import Any

from hyquant_jax.sampling import SamplingConfig


class APIError(Exception):
    """An error answered with `status` and OpenAI's body {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """A checked request: prompt token ids and what `Engine.add_request` takes, plus how to answer."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool

    def engine_arguments(self) -> dict:
        return dict(max_tokens=self.max_tokens, sampling=self.sampling, stop=self.stop, seed=self.seed)


# fields accepted only at these values (OpenAI's defaults): the engine returns one choice without log
# probabilities or penalties
DEFAULTS_ONLY = {"n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False, 0),
                 "top_logprobs": (None, 0), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
                 "logit_bias": (None, {}), "suffix": (None, "")}


def completion_request(body: Any, model_name: str, engine) -> GenerationRequest:
    """A /v1/completions body -> GenerationRequest (engine: its tokenizer, vocabulary and context)."""
    _check_common(body, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise bad("this model has no tokenizer: give the prompt as token ids", "prompt")
        ids = engine.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        if prompt and not 0 <= min(prompt) <= max(prompt) < engine.config.vocab_size:
            raise bad(f"prompt token ids must lie in [0, {engine.config.vocab_size})", "prompt")
        ids = list(prompt)
    else:
        raise bad("prompt must be a string or a list of token ids (one prompt per request)", "prompt")
    return _generation(body, ids, engine, default_max_tokens=16)


def chat_request(body: Any, model_name: str, engine) -> GenerationRequest:
    """A /v1/chat/completions body -> GenerationRequest (the messages through the chat template)."""
    _check_common(body, model_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string role", "messages")
        plain.append({"role": m["role"], "content": _text_content(m.get("content"), i)})
    tokenizer = engine.tokenizer
    if tokenizer is None or not tokenizer.chat_template:
        raise bad("this model has no chat template: use /v1/completions", "messages", code="unsupported")
    try:
        text = tokenizer.apply_chat_template(plain)
    except Exception as e:  # the template's own checks (e.g. roles that must alternate)
        raise bad(f"the chat template refused these messages: {e}", "messages") from e
    ids = tokenizer.encode(text)
    return _generation(body, ids, engine, default_max_tokens=engine.context - len(ids),
                       max_tokens_names=("max_completion_tokens", "max_tokens"))


def _text_content(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _check_common(body, model_name: str) -> None:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", code=None)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model is required: a string naming the served model", "model", code=None)
    if model != model_name:
        raise APIError(404, f"The model `{model}` does not exist; this server serves `{model_name}`", param="model",
                       code="model_not_found")
    for name, allowed in DEFAULTS_ONLY.items():
        if name in body and body[name] not in allowed:
            raise bad(f"{name}={body[name]!r} is not supported by this server (only {allowed[-1]!r})", name,
                      code="unsupported_value")


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (low < value if low_open else low <= value) and value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise bad(f"{name} must be a number in {interval}, got {value!r}", name)
    return float(value)


def _int(body: dict, name: str, default, low: int, high: int | None = None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise bad(f"{name} must be an integer {span}, got {value!r}", name)
    return value


def _generation(body: dict, ids: list[int], engine, default_max_tokens: int,
                max_tokens_names: tuple[str, ...] = ("max_tokens",)) -> GenerationRequest:
    if not ids:
        raise bad("the prompt is empty", "prompt")
    name = next((n for n in max_tokens_names if body.get(n) is not None), max_tokens_names[-1])
    max_tokens = _int(body, name, None, 1)
    context = engine.context
    if len(ids) >= context:
        raise bad(f"This model's context is {context} tokens per request (prompt + completion), but the prompt has "
                  f"{len(ids)} tokens", "messages" if "messages" in body else "prompt", code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(default_max_tokens, context - len(ids))
    if len(ids) + max_tokens > context:
        raise bad(f"This model's context is {context} tokens per request; the prompt has {len(ids)} tokens and "
                  f"{name} is {max_tokens}: use {name} <= {context - len(ids)}", name, code="context_length_exceeded")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _int(body, "top_k", 0, -1)
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise bad("stop must be a non-empty string or a list of at most 4 of them", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f"seed must be an integer, got {seed!r}", "seed")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad(f"stream must be a boolean, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise bad("stream_options must be an object with a boolean include_usage", "stream_options")
    return GenerationRequest(prompt=list(ids), max_tokens=max_tokens,
                             sampling=SamplingConfig(temperature=temperature, top_k=max(top_k, 0), top_p=top_p),
                             stop=tuple(stop), seed=None if seed is None else seed % 2**32, stream=stream,
                             include_usage=bool(options.get("include_usage", False)))


# ---------------------------------------------------------------------- responses


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(kind: str, rid: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
             completion_tokens: int) -> dict:
    """The whole answer of a non-streamed request; kind "chat" or "text"."""
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(kind: str, rid: str, model: str, text: str | None, finish_reason: str | None = None,
          role: bool = False) -> dict:
    """One server-sent event's data of a streamed request; for chat, role=True opens the assistant's message
    and text None closes it (an empty delta with the finish_reason)."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last chunk with stream_options.include_usage: no choices, the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def models_list(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "hyquant"}]}
