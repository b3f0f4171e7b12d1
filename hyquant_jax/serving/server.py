"""`hyquant serve`'s HTTP server: OpenAI's /v1/completions, /v1/chat/completions (streamed as server-sent events
with stream: true), /v1/models and /health on Starlette, served by uvicorn.

The handlers run on uvicorn's event loop and never touch JAX: they check a request (`openai_api`), hand it to
the `EngineWorker` thread, and await its events on an asyncio queue that the worker fills through
`call_soon_threadsafe`. A client that disconnects has its request cancelled, which frees its slot before the
engine's next step. Starlette and uvicorn are the `serve` extra, imported inside the functions that need them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import traceback

from hyquant_jax.serving import openai_api
from hyquant_jax.serving.engine import Engine, QueueFull
from hyquant_jax.serving.openai_api import APIError
from hyquant_jax.serving.worker import EngineWorker

DISCONNECT_POLL_S = 0.5  # how often a non-streamed request checks whether its client is still there


def build_app(worker: EngineWorker, model_name: str, api_key: str | None = None):
    """The Starlette app of the API for the model in `worker.engine`, served as `model_name`; with api_key,
    every request must carry `Authorization: Bearer <api_key>` (else 401)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    engine: Engine = worker.engine
    created = int(time.time())

    def error_response(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    def endpoint(handler):
        """The key check, and any error as a JSON body: a bad request never reaches the engine thread."""

        async def run(request):
            try:
                if api_key is not None and not _key_matches(request.headers.get("authorization", ""), api_key):
                    raise APIError(401, "Incorrect API key provided: pass it as `Authorization: Bearer <key>`",
                                   code="invalid_api_key")
                return await handler(request)
            except APIError as e:
                return error_response(e)
            except Exception as e:  # a bug: this request gets a 500, the server keeps serving
                traceback.print_exc()
                return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

        return run

    async def health(request):
        return JSONResponse({"status": "ok", "model": model_name, "slots": engine.max_slots,
                             "running": engine.running, "waiting": engine.waiting, "context": engine.context})

    async def models(request):
        return JSONResponse(openai_api.models_list(model_name, created))

    async def completions(request):
        spec = openai_api.completion_request(await _json_body(request), model_name, engine)
        return await generate(request, spec, "text")

    async def chat_completions(request):
        spec = openai_api.chat_request(await _json_body(request), model_name, engine)
        return await generate(request, spec, "chat")

    async def generate(request, spec: openai_api.GenerationRequest, kind: str):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        ticket = worker.submit(spec.prompt, lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
                               **spec.engine_arguments())
        try:
            what, value = await events.get()
        except asyncio.CancelledError:
            worker.cancel(ticket)
            raise
        if what == "error":
            raise _engine_error(value)
        rid = openai_api.new_id(kind)
        if spec.stream:
            return StreamingResponse(_stream(worker, ticket, events, spec, kind, rid, model_name),
                                     media_type="text/event-stream")
        text, count = [], 0
        try:
            while True:
                try:
                    what, value = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        worker.cancel(ticket)
                        return JSONResponse({}, status_code=499)  # nobody reads it
                    continue
                if what == "error":
                    raise _engine_error(value)
                text.append(value.text)
                count += len(value.tokens)
                if value.finish_reason is not None:
                    return JSONResponse(openai_api.response(kind, rid, model_name, "".join(text),
                                                            value.finish_reason, len(spec.prompt), count))
        finally:
            if not ticket.done:
                worker.cancel(ticket)

    async def not_found(request, exc):
        return error_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                       code=None))

    routes = [Route("/health", endpoint(health), methods=["GET"]),
              Route("/v1/models", endpoint(models), methods=["GET"]),
              Route("/v1/completions", endpoint(completions), methods=["POST"]),
              Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})


async def _stream(worker: EngineWorker, ticket, events: asyncio.Queue, spec, kind: str, rid: str, model: str):
    """The server-sent events of a streamed request; cancels it when the client goes away (the response task is
    cancelled, or the generator closed, before the last event)."""
    count = 0
    try:
        if kind == "chat":
            yield _event(openai_api.chunk(kind, rid, model, None, role=True))
        while True:
            what, value = await events.get()
            if what == "error":
                error = _engine_error(value)
                yield _event(error.body())
                return
            count += len(value.tokens)
            if value.text:
                yield _event(openai_api.chunk(kind, rid, model, value.text))
            if value.finish_reason is not None:
                yield _event(openai_api.chunk(kind, rid, model, None if kind == "chat" else "", value.finish_reason))
                if spec.include_usage:
                    yield _event(openai_api.usage_chunk(kind, rid, model, len(spec.prompt), count))
                yield "data: [DONE]\n\n"
                return
    finally:
        if not ticket.done:
            worker.cancel(ticket)


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _json_body(request):
    try:
        return json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from e


def _engine_error(e: Exception) -> APIError:
    if isinstance(e, QueueFull):
        return APIError(429, f"the server is busy: {e}", type="rate_limit_error", code="rate_limit_exceeded")
    if isinstance(e, ValueError):
        return APIError(400, str(e), code="invalid_value")
    return APIError(500, f"the engine failed on this request: {type(e).__name__}: {e}", type="server_error")


def _key_matches(header: str, api_key: str) -> bool:
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), api_key.encode())


def serve(engine: Engine, model_name: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          log_level: str = "info") -> None:
    """Compile the engine's step, then serve the API until interrupted (Ctrl-C)."""
    import uvicorn

    print(f"hyquant serve: compiling the decode step for {engine.max_slots} slots of {engine.context} tokens "
          f"(and the prefill of short prompts; longer prompt sizes compile on first use)...", file=sys.stderr,
          flush=True)
    start = time.perf_counter()
    engine.compile()
    print(f"hyquant serve: compiled in {time.perf_counter() - start:.1f} s; the slots' cache takes "
          f"{engine.cache_bytes() / 2**20:.1f} MiB", file=sys.stderr, flush=True)
    worker = EngineWorker(engine)
    worker.start()
    try:
        print(f"hyquant serve: serving `{model_name}` at http://{host}:{port}/v1", file=sys.stderr, flush=True)
        uvicorn.run(build_app(worker, model_name, api_key), host=host, port=port, log_level=log_level)
    finally:
        worker.stop()
