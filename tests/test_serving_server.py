"""`hyquant serve`'s HTTP API on a free loopback port (uvicorn in a thread) over a tiny GGUF checkpoint: the
official openai client (completions, chat, streaming) gets `generate`'s greedy text; raw HTTP gets OpenAI-shaped
errors for bad input and the server keeps serving; a disconnected stream frees its slot; a full queue answers
429; a burst of concurrent requests all complete with the right text and no slot left taken."""

import asyncio
import json
import socket
import threading
import time

import httpx
import jax.numpy as jnp
import numpy as np
import openai
import pytest
import uvicorn

import hyquant_jax as hq
from hyquant_jax.cli.main import main
from hyquant_jax.generate import generate
from hyquant_jax.serving import Engine
from hyquant_jax.serving.server import build_app
from hyquant_jax.serving.worker import EngineWorker
from models import BF16Attention

KEY = "test-key"
NAME = "tiny"
CONTEXT = 256
N = 12  # max_tokens of the requests compared with `generate` (one compiled decode loop)
PROMPT_LENGTHS = (40, 33, 61, 52, 47)  # token-id prompts of one padded size and one power-of-two bound


@pytest.fixture(scope="module")
def checkpoint(tiny_gguf):
    return hq.load(tiny_gguf[0], dtype="float32")


@pytest.fixture(scope="module")
def server(checkpoint):
    """(base url, engine) of a server with 4 slots of 256 tokens (bf16 cache), started in this process."""
    engine = Engine(checkpoint.decoder, BF16Attention(cache_dtype=jnp.bfloat16), tokenizer=checkpoint.tokenizer,
                    max_slots=4, context=CONTEXT, max_queue=64, eos_ids=())  # no EOS: streams run to max_tokens
    engine.compile()
    worker = EngineWorker(engine)
    worker.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(build_app(worker, NAME, api_key=KEY), host="127.0.0.1", port=port,
                                       log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    uv.should_exit = True
    thread.join(10)
    worker.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def id_prompts(checkpoint):
    rng = np.random.default_rng(3)
    return [rng.integers(3, checkpoint.config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def alone(checkpoint):
    """ids -> `generate`'s N greedy tokens for that prompt alone (without EOS, as the server's engine), memoised."""
    cache = {}

    def run(ids):
        key = tuple(ids)
        if key not in cache:
            cache[key] = generate(checkpoint.decoder, [ids], attention=BF16Attention(cache_dtype=jnp.bfloat16),
                                  max_new_tokens=N, eos_ids=(), max_len=CONTEXT).sequences()[0]
        return cache[key]

    return run


def _idle(engine, timeout=20.0):
    deadline = time.monotonic() + timeout
    while engine.busy or any(s is not None for s in engine.slots()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_completions_through_the_openai_client(client, checkpoint, id_prompts, alone, server):
    want = alone(id_prompts[0])
    out = client.completions.create(model=NAME, prompt=id_prompts[0], max_tokens=N, temperature=0)
    choice = out.choices[0]
    assert choice.text == checkpoint.tokenizer.decode(want)
    assert out.usage.prompt_tokens == PROMPT_LENGTHS[0] and out.usage.completion_tokens == len(want)
    assert choice.finish_reason == "length"
    streamed = client.completions.create(model=NAME, prompt=id_prompts[0], max_tokens=N, temperature=0, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    text = client.completions.create(model=NAME, prompt="The lighthouse", max_tokens=N, temperature=0)
    assert text.choices[0].text == checkpoint.tokenizer.decode(alone(checkpoint.tokenizer.encode("The lighthouse")))
    assert [m.id for m in client.models.list().data] == [NAME]


def test_chat_through_the_openai_client(client, checkpoint, alone):
    messages = [{"role": "user", "content": "Who kept the light?"}]
    ids = checkpoint.tokenizer.encode(checkpoint.tokenizer.apply_chat_template(messages))
    want = checkpoint.tokenizer.decode(alone(ids))
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=N, temperature=0)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == want and out.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-2].choices[0].finish_reason == out.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    sampled = client.chat.completions.create(model=NAME, messages=messages, max_tokens=N, temperature=1.0, top_p=0.9,
                                             seed=11)
    again = client.chat.completions.create(model=NAME, messages=messages, max_tokens=N, temperature=1.0, top_p=0.9,
                                           seed=11)
    assert sampled.choices[0].message.content == again.choices[0].message.content


def _post(base, path, body, key=KEY, raw=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        headers["Content-Type"] = "application/json"
    return httpx.post(base + path, content=raw if raw is not None else json.dumps(body), headers=headers, timeout=30)


GOOD = {"model": NAME, "prompt": "hello", "max_tokens": 2}


@pytest.mark.parametrize("path, body, raw, key, status, param", [
    ("/v1/completions", None, "{not json", KEY, 400, None),
    ("/v1/completions", None, '{"model": "tiny", "prompt": "hi", "temperature": NaN}', KEY, 400, "temperature"),
    ("/v1/completions", {**GOOD, "model": "gpt-4"}, None, KEY, 404, "model"),
    ("/v1/completions", {**GOOD, "prompt": "word " * 400}, None, KEY, 400, "prompt"),
    ("/v1/completions", {**GOOD, "max_tokens": 0}, None, KEY, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": CONTEXT}, None, KEY, 400, "max_tokens"),
    ("/v1/completions", {**GOOD, "temperature": -0.5}, None, KEY, 400, "temperature"),
    ("/v1/completions", {**GOOD, "top_p": 0}, None, KEY, 400, "top_p"),
    ("/v1/completions", {**GOOD, "top_p": 1.5}, None, KEY, 400, "top_p"),
    ("/v1/completions", {**GOOD, "n": 3}, None, KEY, 400, "n"),
    ("/v1/completions", {**GOOD, "stop": 7}, None, KEY, 400, "stop"),
    ("/v1/completions", {**GOOD, "prompt": [1, 10**6]}, None, KEY, 400, "prompt"),
    ("/v1/completions", [1, 2], None, KEY, 400, None),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, None, KEY, 400, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"content": "x"}]}, None, KEY, 400, "messages"),
    ("/v1/completions", GOOD, None, None, 401, None),
    ("/v1/completions", GOOD, None, "wrong", 401, None),
    ("/v1/nowhere", GOOD, None, KEY, 404, None),
])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, path, body, raw, key, status, param):
    base, engine = server
    r = _post(base, path, body, key=key, raw=raw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert _post(base, "/v1/completions", GOOD).status_code == 200
    assert not engine.busy or _idle(engine)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    base, engine = server
    body = {**GOOD, "max_tokens": CONTEXT - 8, "stream": True, "stop": None}
    with httpx.stream("POST", base + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert engine.running == 1
    assert _idle(engine), engine.slots()
    with pytest.raises(httpx.ReadTimeout):  # a client that gives up on a whole answer
        httpx.post(base + "/v1/completions", json={**body, "stream": False}, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=httpx.Timeout(30, read=0.3))
    assert engine.running + engine.waiting == 1
    assert _idle(engine), engine.slots()


def test_a_full_queue_answers_429(server):
    """Every slot held by a stream and no room in the queue: the next request gets 429 at once."""
    base, engine = server
    body = {**GOOD, "max_tokens": CONTEXT - 8, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=30) as http:
        streams = [http.stream("POST", base + "/v1/completions", json=body, headers=headers)
                   for _ in range(engine.max_slots)]
        engine.max_queue, limit = 0, engine.max_queue
        try:
            lines = [s.__enter__().iter_lines() for s in streams]  # kept: a dropped iterator closes its stream
            for line in lines:
                assert next(line).startswith("data: ")
            assert None not in engine.slots()
            r = _post(base, "/v1/completions", GOOD)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        finally:
            engine.max_queue = limit
            for s in streams:
                s.__exit__(None, None, None)
    assert _idle(engine), engine.slots()
    assert _post(base, "/v1/completions", GOOD).status_code == 200


def test_many_concurrent_requests_all_complete(server, checkpoint, id_prompts, alone):
    """50 concurrent requests over 4 slots, streamed or not, some abandoned mid-stream: every finished one has
    the tokens of its prompt alone, and no slot stays taken."""
    base, engine = server
    rng = np.random.default_rng(0)
    plan = [(int(rng.integers(len(id_prompts))), int(rng.integers(1, N + 1)), bool(rng.integers(2)),
             bool(rng.random() < 0.15)) for _ in range(50)]
    want = {p: alone(id_prompts[p]) for p in range(len(id_prompts))}
    headers = {"Authorization": f"Bearer {KEY}"}

    async def one(http, p, max_tokens, stream, abandon):
        body = {"model": NAME, "prompt": id_prompts[p], "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if not stream:
            r = await http.post(base + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
            out = r.json()
            return out["choices"][0]["text"], out["usage"]["completion_tokens"]
        text = []
        async with http.stream("POST", base + "/v1/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line or line == "data: [DONE]":
                    continue
                text.append(json.loads(line.removeprefix("data: "))["choices"][0]["text"])
                if abandon:
                    return None
        return "".join(text), None

    async def burst():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=60)) as http:
            return await asyncio.gather(*(one(http, *job) for job in plan))

    results = asyncio.run(burst())
    for (p, max_tokens, _, abandon), got in zip(plan, results):
        if got is None:
            continue
        text, count = got
        assert text == checkpoint.tokenizer.decode(want[p][:max_tokens])
        assert count in (None, len(want[p][:max_tokens]))
    assert _idle(engine), engine.slots()
    health = httpx.get(base + "/health", headers=headers).json()
    assert health["running"] == 0 and health["waiting"] == 0


def test_serve_help_explains_every_option(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "2000")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0 and "(default: None)" not in text and "(default: 127.0.0.1)" in text
    for option in ("--max-slots", "--context", "--max-queue", "--api-key", "--attention", "--rho"):
        assert option in text


@pytest.mark.parametrize("argv, match", [
    (["--max-slots", "0"], "--max-slots must be >= 1"),
    (["--max-queue", "-1"], "--max-queue must be >= 0"),
    (["--port", "70000"], "--port must be in [0, 65535]"),
    (["--api-key", " "], "--api-key must not be empty"),
    (["--attention", "bf16", "--rho", "0.1"], "--rho set the hybrid cache and apply to --attention hyquant only"),
    (["--rho", "2"], "rho"),
])
def test_serve_refuses_bad_options_before_the_model_loads(argv, match, capsys):
    assert main(["serve", *argv]) == 2
    assert match in capsys.readouterr().err
