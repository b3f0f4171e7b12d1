"""Test helpers: write tiny checkpoints (HF safetensors folder, GGUF) and a tiny byte-level BPE tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models.config import ModelConfig
from models.gguf_loader import gguf_name, llama_cpp_permute
from models.hf_loader import hf_name
from models.transformer import Decoder, split_qkv

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "Hello world! Hello tokenizer, hello BPE merges.",
          "Numbers like 12345 and 2024 appear in text; so do tabs\tand newlines\n.", "def f(x):\n    return x * 2\n"]


def numpy_weights(model: Decoder) -> dict[str, np.ndarray]:
    """A model's weights -> short-name float32 arrays in torch Linear layout ([out, in])."""
    e = model.config.hidden_size
    out = {"embed": np.asarray(model.embed[...], np.float32),
           "final_norm": np.asarray(model.final_norm[...], np.float32)}
    if model.lm_head is not None:
        out["lm_head"] = np.asarray(model.lm_head[...], np.float32).T
    names = ("attn_norm", "wqkv", "wo", "bqkv", "q_norm", "k_norm", "mlp_norm", "w_gate", "w_up", "w_down")
    for i, layer in enumerate(model.layers):
        a = {k: None if getattr(layer, k) is None else np.asarray(getattr(layer, k)[...], np.float32) for k in names}
        a["wq"], a["wk"], a["wv"] = split_qkv(a.pop("wqkv"))
        a["bq"], a["bk"], a["bv"] = (None,) * 3 if a["bqkv"] is None else split_qkv(a["bqkv"])
        out.update({f"{i}.q": a["wq"].reshape(e, -1).T, f"{i}.k": a["wk"].reshape(e, -1).T,
                    f"{i}.v": a["wv"].reshape(e, -1).T, f"{i}.o": a["wo"].reshape(-1, e).T,
                    f"{i}.attn_norm": a["attn_norm"], f"{i}.mlp_norm": a["mlp_norm"],
                    f"{i}.gate": a["w_gate"].T, f"{i}.up": a["w_up"].T, f"{i}.down": a["w_down"].T})
        for name, key in (("q_bias", "bq"), ("k_bias", "bk"), ("v_bias", "bv"), ("q_norm", "q_norm"),
                          ("k_norm", "k_norm")):
            if a[key] is not None:
                out[f"{i}.{name}"] = a[key].reshape(-1)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config_dict(config: ModelConfig) -> dict:
    d = {"model_type": config.architecture, "architectures": ["LlamaForCausalLM"], "vocab_size": config.vocab_size,
         "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
         "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
         "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim,
         "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
         "tie_word_embeddings": config.tie_embeddings, "max_position_embeddings": config.max_position,
         "bos_token_id": 1, "eos_token_id": 2}
    if config.qkv_bias and config.architecture != "qwen2":
        d["attention_bias"] = True
    return d


def write_hf_folder(folder: Path, model: Decoder, shards: int = 1, dtype=np.float32) -> Path:
    """config.json + model.safetensors (shards == 1) or sharded files with an index, of model (its config)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    config = model.config
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_dict(config)))
    tensors = {hf_name(k): v.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
               for k, v in numpy_weights(model).items()}
    tensors["model.rotary_emb.inv_freq"] = np.ones(config.head_dim // 2, np.float32)  # ignored extras are fine
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(folder / fname))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def train_tokenizer(vocab_size: int = 320, pre: str = "gpt2"):
    """A tiny byte-level BPE `tokenizers.Tokenizer` (special tokens first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (byte_level if pre == "gpt2" else
                         pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]))
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def vocab_and_merges(tok) -> tuple[list[str], list[str]]:
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return [t for t, _ in vocab], merges


def write_gguf(path: Path, model: Decoder, types: dict[str, str] | None = None,
               arch: str = "llama", tokenizer=None, pre: str = "gpt2",
               raw: dict[str, tuple[str, np.ndarray]] | None = None,
               spm: tuple[list[str], list[float], list[int]] | None = None) -> Path:
    """A GGUF of model (its weights and config) like llama.cpp's converter writes (Q/K rows permuted for the
    llama architecture).

    types: short weight name (or its kind, e.g. "q", "gate") -> GGML type name; default F32.
    raw: short weight name -> (GGML type name, uint8 blocks [rows, bytes per row]) written as they are, in
    place of that weight (for types the `gguf` package cannot quantize; the rows are in the file's order).
    spm: a SentencePiece vocabulary (tokens, scores, token types; <unk>, <s>, </s> first), written as
    llama.cpp's "llama" tokenizer model.
    """
    import gguf
    from gguf import GGMLQuantizationType, quants

    config = model.config
    types = types or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(config.rope_theta)
    w.add_rope_dimension_count(config.head_dim)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_vocab_size(config.vocab_size)
    if config.rope_type == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(config.rope_factor)
        w.add_rope_scaling_orig_ctx_len(config.rope_original_max_position)
    if tokenizer is not None:
        tokens, merges = vocab_and_merges(tokenizer)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_bos_token_id(tokens.index("<|im_start|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_pad_token_id(tokens.index("<|endoftext|>"))
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML)
    if spm is not None:
        tokens, scores, token_types = spm
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(token_types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    for short, arr in numpy_weights(model).items():
        kind = short.split(".")[-1]
        if arch == "llama" and kind in ("q", "q_bias"):
            arr = llama_cpp_permute(arr, config.num_heads)
        elif arch == "llama" and kind in ("k", "k_bias"):
            arr = llama_cpp_permute(arr, config.num_kv_heads)
        qtype = types.get(short, types.get(kind, "F32"))
        if raw and short in raw:
            name, blocks = raw[short]
            w.add_tensor(gguf_name(short), blocks, raw_dtype=GGMLQuantizationType[name])
        elif qtype == "F32":
            w.add_tensor(gguf_name(short), arr.astype(np.float32))
        elif qtype == "F16":
            w.add_tensor(gguf_name(short), arr.astype(np.float16))
        else:
            t = GGMLQuantizationType[qtype]
            w.add_tensor(gguf_name(short), quants.quantize(arr, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
