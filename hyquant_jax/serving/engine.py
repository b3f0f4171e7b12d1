"""`Engine`: continuous batching of generation requests over a fixed number of cache slots.

    engine = Engine(model, make_attention("hyquant"), tokenizer=tokenizer, max_slots=8, context=4096)
    rid = engine.add_request("Hello", max_tokens=32, sampling=SamplingConfig(temperature=0.7), stop=("\\n",))
    for update in engine.stream(rid):       # or: while engine.busy: engine.step()
        print(update.text, end="")
    engine.pop_result(rid).finish_reason    # "stop", "length" or "cancelled"

The decode states hold `max_slots` rows (slots) of `context` tokens each. Every `step()` admits waiting
requests into free slots, prefills one chunk of a long prompt, then runs one jitted decode step over the
running slots with per-slot positions; inactive slots neither grow nor touch the others' tokens. A prompt of
at most `prefill_chunk` tokens is prefilled alone at admission (`hyquant_jax.generate.prefill`); a longer one
is prefilled one chunk per step (`generate.prefill_chunk`), so the running requests gain a token between its
chunks instead of waiting for the whole prompt. Its states are written into the slot's row when its last chunk
has run. A request leaves its slot when it finishes (max_tokens, a stop token or string, the end-of-sequence
token) or is cancelled.

Memory is accounted per slot, not per page: a request is accepted only when its prompt and max_tokens fit one
slot's context, and admitted when a slot is free; beyond the free slots at most `max_queue` requests wait. Why
slots and not a page pool yet: docs/design.md, "Serving".
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.generate import chunked_prefill_states, finish_chunked_prefill, prefill, prefill_chunk
from hyquant_jax.sampling import SamplingConfig
from hyquant_jax.serving.step import RowSampling, check_rows, decode_step, empty_rows, sample_rows, write_row
from hyquant_jax.serving.text import TextStream
from models.transformer import Decoder, check_model, split_model

FINISH_REASONS = ("stop", "length", "cancelled")


class QueueFull(Exception):
    """More requests than the engine's `max_queue` are waiting for a slot."""


@dataclasses.dataclass(frozen=True)
class Update:
    """What one request gained in one `Engine.step`: tokens (new ids), text (new text, "" without a
    tokenizer), finish_reason (None while it runs, else one of FINISH_REASONS)."""

    tokens: list[int]
    text: str = ""
    finish_reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished request: prompt_tokens (ids), tokens (generated ids, a stop token included), text (without a
    tokenizer ""; cut before a stop string), finish_reason (one of FINISH_REASONS)."""

    id: int
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    finish_reason: str


@dataclasses.dataclass
class _Request:
    id: int
    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    seed: int
    stop_ids: frozenset[int]
    text: TextStream | None
    tokens: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None


@dataclasses.dataclass
class _ChunkedPrefill:
    """A long prompt being prefilled one chunk per step: its padded tokens int32 [1, T], the staging states
    and logits so far, and the offset of the next chunk."""

    request: _Request
    tokens: np.ndarray
    states: tuple
    logits: jax.Array
    offset: int = 0


class Engine:
    """Continuous batching over `max_slots` cache slots (see module docstring).

    model: a `models.Decoder`; attention: an attention implementation (`hyquant_jax.make_attention("hyquant")`,
    `models.BF16Attention()`, ...); tokenizer: optional (`models.tokenizer.Tokenizer`), for text prompts, text
    output and stop strings. context: tokens per slot, prompt + max_tokens (default: the model's max_position, at
    most 4096; past `prefill_chunk` a multiple of it). Prompts are padded to `padded_size`: bucket times a power
    of two up to prefill_chunk (few prefill programs to compile), then multiples of prefill_chunk (chunked).
    eos_ids: tokens that end every request (None: the tokenizer's, else the model config's). max_queue: requests
    that may wait once every slot is taken. prefills_per_step: prompts admitted per `step` at most (each short
    prompt's prefill, and each chunk of a long one, delays the running requests' next token). One long prompt
    is prefilled at a time: its staging states hold its whole prompt in bf16 until its last chunk. seed: draws
    the seeds of requests that give none. on_compile: called with a message before a prompt size's prefill
    compiles (the running requests wait meanwhile).
    """

    def __init__(self, model: Decoder, attention, *, tokenizer=None, max_slots: int = 4, context: int | None = None,
                 max_queue: int = 64, prefill_chunk: int = 2048, bucket: int = 64,
                 eos_ids: Sequence[int] | None = None, pad_id: int = 0, prefills_per_step: int = 1,
                 seed: int | None = None, on_compile: Callable[[str], None] | None = None):
        check_model(model)
        config = model.config
        for name, value, low in (("max_slots", max_slots, 1), ("max_queue", max_queue, 0),
                                 ("prefill_chunk", prefill_chunk, 1), ("bucket", bucket, 1),
                                 ("prefills_per_step", prefills_per_step, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        limit = min(config.max_position, config.sliding_window or math.inf)
        if context is None:
            context = min(limit, 4096)
            context -= context % prefill_chunk if context > prefill_chunk else 0
        if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= limit:
            raise ValueError(f"context must be an int in [1, {limit}] (the model's max_position or sliding "
                             f"window), got {context!r}")
        if context > prefill_chunk and context % prefill_chunk:
            raise ValueError(f"context={context} must be a multiple of prefill_chunk={prefill_chunk} (the size "
                             f"prompts longer than one chunk are padded to) or at most one chunk")
        if not isinstance(pad_id, int) or not 0 <= pad_id < config.vocab_size:
            raise ValueError(f"pad_id must be a token id in [0, {config.vocab_size}), got {pad_id!r}")
        if eos_ids is None:
            eos_ids = (tokenizer.eos_ids if tokenizer is not None else ()) or config.eos_token_ids
        self.model, self.attention, self.tokenizer = model, attention, tokenizer
        self.config = config
        self.max_slots, self.context, self.max_queue = max_slots, context, max_queue
        self.prefill_chunk, self.bucket, self.pad_id = prefill_chunk, bucket, pad_id
        self.prefills_per_step = prefills_per_step
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.on_compile = on_compile
        self._compiled_sizes: set[int] = set()
        self._model_def, self._weights = split_model(model)
        self._seeds = np.random.default_rng(seed)
        self._ids = itertools.count()
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: dict[int, _Request] = {}
        self._chunked: _ChunkedPrefill | None = None
        self._results: dict[int, Result] = {}
        self._owner: list[int | None] = [None] * max_slots
        self._last = np.zeros(max_slots, np.int32)
        self._positions = np.zeros(max_slots, np.int32)
        self._sampling = _host_sampling(max_slots)
        self._states = None  # built from the first prefill's row (`_prefill`), or by `compile`

    # ------------------------------------------------------------------ requests

    def check_request(self, prompt_tokens: int, max_tokens) -> None:
        """Raise ValueError unless a prompt of this many tokens with max_tokens fits one slot."""
        if prompt_tokens < 1:
            raise ValueError("the prompt must hold at least one token")
        if prompt_tokens > self.context - 1:
            raise ValueError(f"the prompt has {prompt_tokens} tokens; this server's context is {self.context} "
                             f"tokens (prompt + max_tokens), so a prompt may have at most {self.context - 1}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if prompt_tokens + max_tokens > self.context:
            raise ValueError(f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                             f"{prompt_tokens + max_tokens} exceeds the context of {self.context} tokens; use "
                             f"max_tokens <= {self.context - prompt_tokens}")

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt given as text (needs a tokenizer) or as ids; a ValueError when invalid."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs an engine with a tokenizer; pass token ids")
            return self.tokenizer.encode(prompt)
        ids = list(prompt)
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise ValueError("prompt must be a str or a sequence of int token ids")
        if ids and not 0 <= min(ids) <= max(ids) < self.config.vocab_size:
            raise ValueError(f"prompt token ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{min(ids)}, {max(ids)}]")
        return [int(i) for i in ids]

    def add_request(self, prompt: str | Sequence[int], *, max_tokens: int,
                    sampling: SamplingConfig = SamplingConfig(), stop: Sequence[int | str] = (),
                    seed: int | None = None) -> int:
        """Queue a request; returns its id. prompt: text or token ids; max_tokens: tokens to generate at most;
        sampling: greedy by default; stop: token ids and strings that end it (strings need a tokenizer; the
        engine's eos_ids end every request); seed: of its samples (None: drawn by the engine).
        Raises ValueError for a request that cannot run (too long, bad argument), QueueFull when max_queue
        requests already wait beyond the free slots."""
        ids = self.encode(prompt)
        self.check_request(len(ids), max_tokens)
        if not isinstance(sampling, SamplingConfig):
            raise ValueError(f"sampling must be a hyquant_jax.SamplingConfig, got {type(sampling).__name__}")
        stop = tuple(stop)
        strings = tuple(s for s in stop if isinstance(s, str))
        stop_ids = [s for s in stop if not isinstance(s, str)]
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in stop_ids):
            raise ValueError(f"stop must hold token ids (int) and strings, got {stop!r}")
        if strings and self.tokenizer is None:
            raise ValueError("stop strings need an engine with a tokenizer; pass stop token ids")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
            raise ValueError(f"seed must be None or an int in [0, 2**32), got {seed!r}")
        if len(self._waiting) >= self.max_queue + self._owner.count(None):
            raise QueueFull(f"all {self.max_slots} slots are taken and {self.max_queue} requests already wait "
                            f"(the queue's limit); retry later")
        request = _Request(id=next(self._ids), prompt=ids, max_tokens=max_tokens, sampling=sampling,
                           seed=int(self._seeds.integers(2**32)) if seed is None else seed,
                           stop_ids=frozenset(int(s) for s in stop_ids),
                           text=TextStream(self.tokenizer, strings) if self.tokenizer is not None else None)
        self._waiting.append(request)
        return request.id

    def cancel(self, request_id: int) -> bool:
        """Stop a waiting or running request (its slot is freed; its result has finish_reason "cancelled").
        Returns False when it was not waiting or running."""
        for request in self._waiting:
            if request.id == request_id:
                self._waiting.remove(request)
                self._finish(request, "cancelled")
                return True
        if request_id in self._running:
            self._finish(self._running[request_id], "cancelled")
            return True
        if self._chunked is not None and self._chunked.request.id == request_id:
            request, self._chunked = self._chunked.request, None
            self._finish(request, "cancelled")
            return True
        return False

    def pop_result(self, request_id: int) -> Result | None:
        """The finished request's result, removed from the engine (None while it waits or runs, or unknown)."""
        return self._results.pop(request_id, None)

    # ------------------------------------------------------------------ stepping

    @property
    def busy(self) -> bool:
        """Whether a request waits, is being prefilled or runs."""
        return bool(self._waiting or self._running or self._chunked is not None)

    def step(self) -> dict[int, Update]:
        """Admit waiting requests into free slots (up to prefills_per_step; a long prompt waits while another is
        being prefilled), prefill one chunk of the long prompt, then decode one token for every running
        request. Returns {request id: Update} for each request that gained tokens or finished."""
        updates: dict[int, Update] = {}
        for _ in range(self.prefills_per_step):
            if not self._waiting or None not in self._owner:
                break
            long_prompt = len(self._waiting[0].prompt) > self.prefill_chunk
            if long_prompt and self._chunked is not None:
                break
            request = self._waiting.popleft()
            if long_prompt:
                self._start_chunked(request, self._owner.index(None))
                continue
            logits, row = self._prefill(request.prompt)
            self._place(request, self._owner.index(None), logits, row)
            updates[request.id] = self._emit(request, [int(self._last[request.slot])])
        if self._chunked is not None:
            request = self._next_chunk()
            if request is not None:
                updates[request.id] = self._emit(request, [int(self._last[request.slot])])
        if self._running:
            active = np.array([o is not None and o in self._running for o in self._owner])
            self._states, tokens = decode_step(
                self._model_def, self._weights, self._states, jnp.asarray(self._last),
                jnp.asarray(self._positions), jnp.asarray(active), self._device_sampling(),
                attention=self.attention, pad_id=self.pad_id)
            tokens = np.asarray(tokens)
            self._positions += active
            self._last = np.where(active, tokens, self._last).astype(np.int32)
            for slot in np.flatnonzero(active):
                request = self._running[self._owner[slot]]
                update = self._emit(request, [int(tokens[slot])])
                before = updates.get(request.id)
                updates[request.id] = update if before is None else Update(
                    before.tokens + update.tokens, before.text + update.text, update.finish_reason)
        return updates

    def stream(self, request_id: int) -> Iterator[Update]:
        """Step the engine until the request finishes, yielding its updates (other requests run along)."""
        while (request_id in self._running or any(r.id == request_id for r in self._waiting)
               or (self._chunked is not None and self._chunked.request.id == request_id)):
            update = self.step().get(request_id)
            if update is not None:
                yield update

    def run(self) -> dict[int, Result]:
        """Step until no request waits or runs; returns (and removes) every finished request's result."""
        while self.busy:
            self.step()
        results, self._results = self._results, {}
        return results

    def compile(self) -> None:
        """Compile the decode step (and the prefill of the shortest prompts) before the first request: one
        step with every slot free, which changes no slot's state."""
        if self._states is None:
            _, row = self._prefill([self.pad_id])
            self._states = empty_rows(row, self.max_slots)
        active = jnp.zeros(self.max_slots, bool)
        self._states, tokens = decode_step(
            self._model_def, self._weights, self._states, jnp.asarray(self._last), jnp.asarray(self._positions),
            active, self._device_sampling(), attention=self.attention, pad_id=self.pad_id)
        tokens.block_until_ready()

    def reset(self) -> list[int]:
        """Cancel every waiting and running request and drop the slots' states (rebuilt at the next admission),
        e.g. after a failed step whose donated states are gone. Returns the ids of the cancelled requests."""
        ids = [r.id for r in self._waiting] + list(self._running)
        ids += [self._chunked.request.id] if self._chunked is not None else []
        for rid in ids:
            self.cancel(rid)
        self._states = None
        return ids

    # ------------------------------------------------------------------ accounting

    def slots(self) -> tuple[int | None, ...]:
        """The id of the request in each slot (None: free)."""
        return tuple(self._owner)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def prefilling(self) -> int | None:
        """The id of the long prompt's request being prefilled chunk by chunk (None: none)."""
        return None if self._chunked is None else self._chunked.request.id

    def cache_bytes(self) -> int:
        """Bytes of the slots' decode states (all layers; 0 before the first prefill or `compile`)."""
        leaves = jax.tree_util.tree_leaves(self._states) if self._states is not None else []
        return sum(x.size * x.dtype.itemsize for x in leaves)

    def check_invariants(self) -> None:
        """Raise AssertionError unless the slot accounting is consistent: each running request owns exactly the
        one slot that names it, no slot is owned twice, waiting and running requests are disjoint, the queue
        is within max_queue and every running request fits its slot."""
        owners = [o for o in self._owner if o is not None]
        assert len(owners) == len(set(owners)), f"a request owns several slots: {self._owner}"
        chunked = {self._chunked.request.id} if self._chunked is not None else set()
        assert set(owners) == set(self._running) | chunked, (
            f"slots {self._owner} against running {sorted(self._running)} and prefilling {chunked}")
        assert not chunked & set(self._running), "a request both runs and is being prefilled"
        if self._chunked is not None:
            request = self._chunked.request
            assert self._owner[request.slot] == request.id and not request.tokens
            assert 0 <= self._chunked.offset < self._chunked.tokens.shape[1]
        for rid, request in self._running.items():
            assert self._owner[request.slot] == rid, f"request {rid} names slot {request.slot}: {self._owner}"
            assert len(request.prompt) + len(request.tokens) <= self.context
            assert self._positions[request.slot] == len(request.prompt) + len(request.tokens) - 1
        waiting = [r.id for r in self._waiting]
        assert not set(waiting) & (set(self._running) | chunked), "a request both waits and runs"
        assert len(waiting) <= self.max_queue + self._owner.count(None) and not set(waiting) & set(self._results)

    # ------------------------------------------------------------------ internals

    def padded_size(self, prompt_tokens: int) -> int:
        """The padded length of a prompt: bucket * 2**k up to prefill_chunk (and context), then a multiple of
        prefill_chunk."""
        if prompt_tokens > self.prefill_chunk:
            return -(-prompt_tokens // self.prefill_chunk) * self.prefill_chunk
        size = self.bucket << max(0, math.ceil(math.log2(prompt_tokens / self.bucket)))
        return min(size, self.prefill_chunk, self.context)

    def _padded_tokens(self, ids: list[int], what: str) -> np.ndarray:
        """int32 [1, padded_size] of a prompt; says when a new size's program compiles."""
        padded = self.padded_size(len(ids))
        if padded not in self._compiled_sizes and self.on_compile is not None:
            self.on_compile(f"compiling the {what} of prompts padded to {padded} tokens (once)")
        self._compiled_sizes.add(padded)
        tokens = np.full((1, padded), self.pad_id, np.int32)
        tokens[0, :len(ids)] = ids
        return tokens

    def _prefill(self, ids: list[int]):
        """(logits float32 [1, V], decode states with batch 1 and capacity `context`) of one prompt."""
        tokens = self._padded_tokens(ids, "prefill")
        _, logits, row = prefill(self._model_def, self._weights, jnp.asarray(tokens),
                                 jnp.array([len(ids)], jnp.int32), jax.random.PRNGKey(0),
                                 attention=self.attention, sampling=SamplingConfig(), chunk=self.prefill_chunk,
                                 max_len=self.context, min_length=0)
        for state in row:
            check_rows(state)
        return logits, row

    def _start_chunked(self, request: _Request, slot: int) -> None:
        """Reserve the slot for a long prompt whose chunks the next steps prefill."""
        tokens = self._padded_tokens(request.prompt, "chunked prefill")
        states = chunked_prefill_states(self.model, self.attention, 1, tokens.shape[1], self.context)
        logits = jnp.zeros((1, self.config.vocab_size), jnp.float32)
        self._chunked = _ChunkedPrefill(request, tokens, states, logits)
        self._owner[slot], request.slot = request.id, slot

    def _next_chunk(self) -> _Request | None:
        """Prefill the long prompt's next chunk; after its last, place it in its slot and return its request."""
        job, c = self._chunked, self.prefill_chunk
        lengths = jnp.array([len(job.request.prompt)], jnp.int32)
        tokens = jnp.asarray(job.tokens[:, job.offset:job.offset + c])
        job.states, job.logits = prefill_chunk(self._model_def, self._weights, job.states, job.logits, tokens,
                                               jnp.int32(job.offset), lengths, attention=self.attention,
                                               max_len=self.context)
        job.offset += c
        if job.offset < job.tokens.shape[1]:
            return None
        row = finish_chunked_prefill(job.states, lengths, attention=self.attention, max_len=self.context)
        for state in row:
            check_rows(state)
        self._chunked = None
        self._place(job.request, job.request.slot, job.logits, row)
        return job.request

    def _place(self, request: _Request, slot: int, logits: jax.Array, row: tuple) -> None:
        """Write a prefilled prompt's states into the slot's row and sample its first token: it runs."""
        if self._states is None:
            self._states = empty_rows(row, self.max_slots)
        self._states = write_row(self._states, row, jnp.int32(slot))
        s = request.sampling
        self._sampling["key"][slot] = np.asarray(jax.random.PRNGKey(request.seed))
        self._sampling["temperature"][slot] = s.temperature
        self._sampling["top_k"][slot] = s.top_k
        self._sampling["top_p"][slot] = s.top_p
        one = RowSampling(*(jnp.asarray(self._sampling[k][slot:slot + 1]) for k in _SAMPLING_FIELDS))
        first = sample_rows(logits, one, jnp.array([len(request.prompt)], jnp.int32))
        self._owner[slot], request.slot = request.id, slot
        self._running[request.id] = request
        self._last[slot], self._positions[slot] = int(first[0]), len(request.prompt)

    def _emit(self, request: _Request, tokens: list[int]) -> Update:
        """Record a request's new tokens; finish it on a stop token or string, or at max_tokens."""
        request.tokens += tokens
        text, stopped = request.text.add(tokens) if request.text is not None else ("", False)
        reason = None
        if stopped or tokens[-1] in self.eos_ids or tokens[-1] in request.stop_ids:
            reason = "stop"
        elif len(request.tokens) >= request.max_tokens:
            reason = "length"
        if reason is not None:
            text += self._finish(request, reason)
        return Update(tokens, text, reason)

    def _finish(self, request: _Request, reason: str) -> str:
        """Free the request's slot and keep its result; returns its text still held back."""
        self._running.pop(request.id, None)
        if request.slot is not None:
            self._owner[request.slot] = None
            self._sampling["temperature"][request.slot] = 0.0  # a free slot samples nothing
            request.slot = None
        rest = request.text.finish() if request.text is not None else ""
        text = request.text.text if request.text is not None else ""
        self._results[request.id] = Result(request.id, request.prompt, list(request.tokens), text, reason)
        return rest

    def _device_sampling(self) -> RowSampling:
        return RowSampling(*(jnp.asarray(self._sampling[k]) for k in _SAMPLING_FIELDS))


_SAMPLING_FIELDS = ("key", "temperature", "top_k", "top_p")


def _host_sampling(slots: int) -> dict[str, np.ndarray]:
    return dict(key=np.zeros((slots, 2), np.uint32), temperature=np.zeros(slots, np.float32),
                top_k=np.zeros(slots, np.int32), top_p=np.ones(slots, np.float32))
