"""Tokenizers from a HF folder (tokenizer.json) or a GGUF vocabulary, and chat templates.

Both build a `tokenizers.Tokenizer`; `Tokenizer` adds the special ids and the
chat template (rendered with jinja2 as transformers does).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

# llama.cpp pre-tokenizer names -> split regex (None: GPT-2's, built into ByteLevel).
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GGUF_PRE_TOKENIZERS = ("default", "gpt-2", "gpt2", "smollm", "llama-bpe", "llama3", "qwen2")


@dataclasses.dataclass
class Tokenizer:
    """A `tokenizers.Tokenizer` plus the checkpoint's special tokens and chat template.

    add_bos: prepend bos_id when encoding with `special=True`, unless the text starts with it already (as
      chat templates that render bos_token do).
    """

    backend: object
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of text; special-token strings like <|im_start|> map to their ids."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token(self, i: int) -> str | None:
        return self.backend.id_to_token(int(i))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages [{"role", "content"}, ...] with the checkpoint's template.

        Raises ValueError when the checkpoint has no chat template.
        """
        if not self.chat_template:
            raise ValueError("this checkpoint has no chat template (tokenizer.chat_template); use a raw prompt")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        tok = lambda i: "" if i is None else (self.token(i) or "")  # noqa: E731
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=tok(self.bos_id), eos_token=tok(self.eos_ids[0] if self.eos_ids else None))


# --------------------------------------------------------------------------- HF folder


def load_hf_tokenizer(folder: str | Path) -> Tokenizer:
    """Tokenizer of a HF folder: tokenizer.json, tokenizer_config.json (bos, eos, chat template) and the chat
    template in chat_template.jinja or chat_template.json where tokenizer_config.json has none."""
    from tokenizers import Tokenizer as Backend

    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ValueError(f"{folder}: no tokenizer.json")
    backend = Backend.from_file(str(path))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}

    def tid(name):
        value = cfg.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        return None if value is None else backend.token_to_id(value)

    template = cfg.get("chat_template")
    if template is None and (folder / "chat_template.jinja").exists():  # transformers >= 4.47 saves it apart
        template = (folder / "chat_template.jinja").read_text()
    elif template is None and (folder / "chat_template.json").exists():
        template = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    eos = tid("eos_token")
    # tokenizer.json's post-processor adds BOS itself for Llama-style models; we add it by hand.
    add_bos = bool(cfg.get("add_bos_token", False)) or _post_processor_adds_bos(backend, tid("bos_token"))
    backend.no_padding()
    return Tokenizer(backend=backend, bos_id=tid("bos_token"), eos_ids=() if eos is None else (eos,),
                     pad_id=tid("pad_token"), add_bos=add_bos, chat_template=template)


def _post_processor_adds_bos(backend, bos_id) -> bool:
    if bos_id is None:
        return False
    return backend.encode("a", add_special_tokens=True).ids[:1] == [bos_id]


# --------------------------------------------------------------------------- GGUF


def _pre_tokenizer(pre: str, path):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre == "smollm":  # SmolLM/SmolLM2: digits split one by one, then GPT-2 byte level
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    regex = {"llama-bpe": _LLAMA3_REGEX, "llama3": _LLAMA3_REGEX, "qwen2": _QWEN2_REGEX}.get(pre)
    if regex is None:
        raise ValueError(f"{path}: tokenizer.ggml.pre={pre!r} is not supported; supported: {GGUF_PRE_TOKENIZERS}")
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


# llama.cpp token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space


def tokenizer_from_gguf(reader, path="") -> Tokenizer:
    """Tokenizer from GGUF metadata: byte-level BPE (tokenizer.ggml.model "gpt2": Llama 3, Qwen, SmolLM) or
    SentencePiece BPE ("llama": Llama 2, Mistral 7B v0.1-v0.3, TinyLlama).

    gpt2: vocabulary from tokenizer.ggml.tokens, merges from tokenizer.ggml.merges. llama: see `_spm_backend`.
    Tokens of type CONTROL (3) or USER_DEFINED (4) become special tokens that match whole in text. Chat
    template from tokenizer.chat_template.
    """
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as Backend

    from models.gguf_loader import field

    kind = field(reader, "tokenizer.ggml.model")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens or [])
    if kind == "gpt2":
        merges = field(reader, "tokenizer.ggml.merges") or []
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        backend = Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        backend.pre_tokenizer = _pre_tokenizer(field(reader, "tokenizer.ggml.pre", "default"), path)
        backend.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = field(reader, "tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ValueError(f"{path}: a SentencePiece ('llama') tokenizer needs tokenizer.ggml.scores, one per "
                             f"token ({len(tokens)})")
        unk = field(reader, "tokenizer.ggml.unknown_token_id", 0)
        backend = _spm_backend(tokens, scores, types, int(unk),
                               bool(field(reader, "tokenizer.ggml.add_space_prefix", True)))
    else:
        raise ValueError(f"{path}: tokenizer.ggml.model={kind!r} is not supported; supported: 'gpt2' "
                         "(byte-level BPE), 'llama' (SentencePiece BPE)")
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types)
               if t in (CONTROL, USER_DEFINED)]
    backend.add_special_tokens(special)

    def tid(key):
        value = field(reader, key)
        return None if value is None else int(value)

    eos = [tid("tokenizer.ggml.eos_token_id"), tid("tokenizer.ggml.eot_token_id")]
    return Tokenizer(
        backend=backend, bos_id=tid("tokenizer.ggml.bos_token_id"),
        eos_ids=tuple(dict.fromkeys(e for e in eos if e is not None)),
        pad_id=tid("tokenizer.ggml.padding_token_id"),
        add_bos=bool(field(reader, "tokenizer.ggml.add_bos_token", kind == "llama")),
        chat_template=field(reader, "tokenizer.chat_template"))


def _spm_backend(tokens: list[str], scores: list[float], types: list[int], unk_id: int, add_space_prefix: bool):
    """SentencePiece BPE as llama.cpp runs it, as a `tokenizers` BPE.

    SentencePiece merges, again and again, the adjacent pair of pieces whose concatenation is a NORMAL token
    with the highest score (the leftmost on ties); characters outside the vocabulary become their UTF-8 byte
    tokens <0xXX>. A BPE whose merges are every split of every NORMAL token into two NORMAL tokens, ranked by
    the merged token's score, does the same. Spaces become U+2581, with one prepended when add_space_prefix
    (tokenizer.ggml.add_space_prefix, default true); decoding undoes both.
    """
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    merges = []
    for merged, i in normal.items():
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in normal and right in normal:
                merges.append((-float(scores[i]), i, normal[left], (left, right)))
    merges.sort()
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=[m[-1] for m in merges], unk_token=tokens[unk_id],
                                 fuse_unk=True, byte_fallback=True))
    replace = normalizers.Replace(" ", SPACE)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if add_space_prefix else replace
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] if add_space_prefix else steps)
    return backend
