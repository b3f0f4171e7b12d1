"""`hyquant generate`: load a checkpoint, generate with HyQuant (or a baseline), optionally compare with bf16.

Every option is checked before the model loads or anything compiles (a bad one is a one-line error, exit code 2);
the text streams as it is decoded for one prompt; compiled programs are kept in a persistent cache, so a second
run with the same shapes skips the compilation.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np

from hyquant_jax.api import compute_dtype, load
from hyquant_jax.backends import resolve_backend
from hyquant_jax.cache import smaller_than_bf16_from
from hyquant_jax.cli.options import (
    add_config_args,
    add_model_args,
    check_backend,
    config_from_args,
    given_config_options,
    use_compile_cache,
)
from hyquant_jax.cli.output import ResultFile
from hyquant_jax.config import HyQuantConfig
from hyquant_jax.sampling import MAX_SEED, SamplingConfig, check_seed
from hyquant_jax.sharding import describe_mesh, make_mesh, parse_mesh_shape
from models.checkpoint import resolve_model_path

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


HELP = "generate text with a real model through the HyQuant KV cache"
DESCRIPTION = (
    "Load a checkpoint (default: SmolLM2-135M-Instruct), wrap the prompt in its chat template, generate with the "
    "chosen KV cache (HyQuant by default), streaming the text of one prompt as it decodes, and print tokens/s and "
    "the KV-cache bytes (bf16 vs the chosen cache); with --compare-bf16 also the share of generated tokens "
    "identical to a bf16 run. Without a GPU everything runs on the XLA reference path. Example: hyquant generate "
    "-p \"What is the capital of France?\" -n 16")


def add_parser(subparsers, formatter_class) -> None:
    """The `generate` subcommand: its own options, then the HyQuant settings."""
    p = subparsers.add_parser("generate", help=HELP, description=DESCRIPTION, formatter_class=formatter_class)
    add_generate_args(p)
    add_config_args(p)


def run(args: argparse.Namespace) -> int:
    """`hyquant generate` from parsed options: exit code 0, or 2 where the JSON record could not be written (it
    went to stdout instead); bad options raise ValueError before anything loads."""
    checked = check_generate_args(args, config_from_args(args))
    for warning in checked["warnings"]:
        print(f"hyquant: warning: {warning}", file=sys.stderr)
    result = run_generate(args, checked)
    return 0 if checked["output"] is None or checked["output"].write(result) else 2


# The line ahead of a single prompt's generated text, so that it does not read as part of the output above.
TEXT_HEADER = "--- generated text ---"


def add_generate_args(p) -> None:
    """Options of `hyquant generate` other than the HyQuant settings (`hyquant_jax.cli.options`)."""
    add_model_args(p)
    p.add_argument("-p", "--prompt", action="append", default=None,
                   help="prompt text; repeat for a ragged batch (default: a built-in ~900-token document and a "
                        "question about it)")
    p.add_argument("-f", "--prompt-file", action="append", default=None,
                   help="read a prompt from this UTF-8 text file (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not wrap prompts in the checkpoint's chat template")
    p.add_argument("-n", "--max-new-tokens", type=int, default=96, help="tokens to generate per prompt at most")
    p.add_argument("--compare-bf16", action="store_true",
                   help="also generate with an exact bf16 cache and report the share of identical tokens (runs "
                        "and compiles the model a second time)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=seed_option, default=0, help=f"sampling seed, an integer in 0 .. 2**32 - 1 "
                                                                 f"({MAX_SEED})")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="run on a device mesh: weights split Megatron-style over M devices (attention by KV heads, "
                        "which M must divide), the prompts over D (the prompt count must be a multiple of D); "
                        "e.g. data=1,model=2. On CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N "
                        "virtual devices")
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() first (several hosts; the cluster is auto-detected), "
                        "so --mesh spans every host's devices")
    p.add_argument("--json", metavar="PATH",
                   help="also write the results as one JSON record to PATH ('-': to stdout, the text then goes to "
                        "stderr); the path is checked before the run and the file replaced whole at its end (if that "
                        "write fails, the record goes to stdout)")
    p.add_argument("--no-stream", action="store_true", help="print the text when it is complete, not as it decodes")


def seed_option(text: str) -> int:
    """--seed's type: an integer in 0 .. MAX_SEED (what `generate` takes), else argparse's one-line error."""
    try:
        return check_seed(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in 0 .. 2**32 - 1 ({MAX_SEED}), got {text!r}") from None


def check_generate_args(args, config: HyQuantConfig) -> dict:
    """Everything about the options that can be checked before the model loads: ValueErrors naming the option
    and what it accepts. Returns the prompt files' texts, the sampling config, the JSON output (prepared) and
    the warnings about options that have no effect."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk must be >= 1 (tokens prefilled per call), got {args.prefill_chunk}")
    try:
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        raise ValueError(str(e).replace("SamplingConfig.temperature", "--temperature")
                         .replace("SamplingConfig.top_k", "--top-k").replace("SamplingConfig.top_p", "--top-p")) from e
    if args.attention != "hyquant":
        # the HyQuant settings and --backend set the hybrid cache: they apply to --attention hyquant only
        given = given_config_options(args) + (["--backend"] if args.backend is not None else [])
        if given:
            raise ValueError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} the hybrid cache and "
                             f"appl{'ies' if len(given) == 1 else 'y'} to --attention hyquant only, not "
                             f"--attention {args.attention}" + (
                                 " (the baselines' bits are in their names, e.g. kivi2, uniform8)"
                                 if {"--key-bits", "--value-bits"} & set(given) else ""))
    check_backend(args.backend or "auto")
    texts = []
    for path in args.prompt_file or []:
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"--prompt-file {path} is a folder, not a text file")
        if not p.is_file():
            raise ValueError(f"--prompt-file {path} does not exist")
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--prompt-file {path} is not a readable UTF-8 text file ({e})") from e
    if getattr(args, "mesh", None):
        with _as_option("--mesh"):
            parse_mesh_shape(args.mesh)  # the devices are counted once they are known (after --distributed)
    if args.model is not None:
        try:
            resolve_model_path(args.model)
        except ValueError as e:  # its messages start with "model NAME": a path that is not there, a name not fetched
            raise ValueError(f"--{e}") from e
    output = ResultFile(args.json, "--json").prepare() if args.json else None
    flags = {"top_k": "--top-k", "top_p": "--top-p"}
    warnings = [f"{flags[name]} has no effect with greedy decoding (--temperature 0)" for name in sampling.ignored()]
    return {"prompt_texts": texts, "sampling": sampling, "config": config, "output": output, "warnings": warnings}


@contextlib.contextmanager
def _as_option(option: str):
    """A ValueError of the library that names the argument ("mesh ...") names the option instead ("--mesh ...")."""
    try:
        yield
    except ValueError as e:
        name = option.lstrip("-")
        text = str(e)
        raise ValueError(f"--{text}" if text.startswith(f"{name} ") else f"{option}: {text}") from e


def environment() -> dict:
    """device, platform, jax version, date and the command, as the benchmarks' results record them."""
    dev = jax.devices()[0]
    return {"device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in ["hyquant", *sys.argv[1:]])}


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


def run_generate(args, checked: dict, echo=print) -> dict:
    """Implementation of `hyquant generate` (args of `add_parser`'s options, `check_generate_args`' result);
    returns the JSON-able result."""
    sampling, config = checked["sampling"], checked["config"]
    to_stdout = args.json == "-"
    if to_stdout:  # stdout carries the JSON record alone
        echo = _to_stderr
    use_compile_cache(args)
    if getattr(args, "distributed", False):
        jax.distributed.initialize()
        if jax.process_index() != 0:
            echo = _quiet
    mesh = None
    if getattr(args, "mesh", None):
        with _as_option("--mesh"):
            mesh = make_mesh(args.mesh)
    t0 = time.perf_counter()
    # With a mesh, weights are read into host memory and then split over the devices (no device holds all).
    where = jax.default_device(jax.devices("cpu")[0]) if mesh is not None else contextlib.nullcontext()
    with where:
        model = load(args.model, dtype=args.dtype, progress=True)
    load_s = time.perf_counter() - t0
    cfg = model.config
    texts = list(args.prompt or []) + checked["prompt_texts"] or [default_prompt()]
    prompt_ids = model.prompt_ids(texts, chat=not args.raw)
    backend = resolve_backend(args.backend or "auto")
    echo(f"model: {model.name}: {cfg.architecture}, {cfg.num_layers} layers, {cfg.num_heads}/{cfg.num_kv_heads} "
         f"heads, head_dim {cfg.head_dim}, {_fmt_params(cfg.num_params())} params (loaded in {load_s:.1f} s)")
    echo(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), compute "
         f"{np.dtype(compute_dtype(args.dtype)).name}, bf16 KV cache, hybrid-cache backend {backend}")
    if mesh is not None:
        echo(f"mesh: {describe_mesh(mesh)}")
    echo(f"prompts: {len(texts)}, lengths {[len(p) for p in prompt_ids]} tokens; max {args.max_new_tokens} new "
         f"tokens, {'greedy' if sampling.greedy else 'sampling'}")

    kinds = [args.attention] + (["bf16"] if args.compare_bf16 and args.attention != "bf16" else [])
    runs = {}
    for i, kind in enumerate(kinds):
        label = _describe(kind, config)
        stream = i == 0 and len(texts) == 1 and not args.no_stream and not to_stdout
        echo(f"\n=== {kind}: {label} ===")
        cached = "" if args.no_compile_cache else " (cached for later runs)"
        echo(f"[compiling prefill and decode for these shapes{cached} ...]", file=sys.stderr)
        on_text = None
        if stream:
            echo(TEXT_HEADER)
            on_text = _Printer(echo)
        try:
            out = model.generate(texts, args.max_new_tokens, sampling=sampling, attention=kind,
                                 config=config if kind == "hyquant" else None, chat=not args.raw,
                                 backend=args.backend or "auto", seed=args.seed, prefill_chunk=args.prefill_chunk,
                                 mesh=mesh, on_text=on_text)
        finally:
            if stream:
                on_text.finish()  # the streamed line ends before whatever comes next (an error, "interrupted")
        res = out.result
        generated = int(res.lengths.sum())
        kv, bf16_kv = np.array(out.kv_bytes, np.int64), np.array(out.kv_bytes_bf16, np.int64)
        runs[kind] = {
            "label": label, "texts": out.texts, "tokens": [c.tokens for c in out.completions],
            "finish_reasons": [c.finish_reason for c in out.completions],
            "compile_s": out.compile_seconds, "prefill_s": out.prefill_seconds, "decode_s": out.decode_seconds,
            "decode_steps": out.decode_steps, "cached_tokens": res.cache_lengths.tolist(),
            "prefill_tokens_per_s": float(res.prompt_lengths.sum() / res.prefill_seconds),
            "decode_tokens_per_s": out.decode_tokens_per_s,
            "decode_ms_per_step": 1e3 * out.decode_seconds / max(out.decode_steps, 1),
            "kv_bytes": kv.tolist(), "kv_bytes_bf16": bf16_kv.tolist(),
        }
        r = runs[kind]
        if not stream:
            for j, text in enumerate(r["texts"]):
                echo(f"--- generated text of prompt {j} ({len(r['tokens'][j])} tokens) ---" if len(texts) > 1
                     else TEXT_HEADER)
                echo(text.strip())
        rate = f"{r['decode_tokens_per_s']:.1f} tokens/s" if r["decode_tokens_per_s"] else "n/a"
        echo(f"--- compile {out.compile_seconds:.1f} s; prefill {int(res.prompt_lengths.sum())} tokens in "
             f"{out.prefill_seconds:.2f} s; decode {generated} tokens in {out.decode_seconds:.2f} s ({rate}, "
             f"{r['decode_ms_per_step']:.0f} ms/step)")
        echo("    " + _size_line(kind, kv, bf16_kv, config, cfg))

    result = {"model": model.name, "environment": environment(), "device": jax.devices()[0].device_kind,
              "compute_dtype": np.dtype(compute_dtype(args.dtype)).name, "backend": backend,
              "config": _config_dict(config),
              "prompt_lengths": [len(p) for p in prompt_ids], "runs": runs}
    if mesh is not None:
        result["mesh"] = dict(mesh.shape)
    if len(kinds) == 2:
        a, b = runs[kinds[0]]["tokens"], runs["bf16"]["tokens"]
        shares = [agreement(x, y) for x, y in zip(a, b)]
        total = sum(max(len(x), len(y)) for x, y in zip(a, b))
        share = sum(s * max(len(x), len(y)) for (s, _), x, y in zip(shares, a, b)) / max(total, 1)
        result["agreement_with_bf16"] = share
        result["first_difference"] = [f for _, f in shares]
        word = "greedy tokens" if sampling.greedy else "sampled tokens (same seed)"
        echo(f"\n{word} identical to the bf16 run: {100 * share:.1f}% "
             f"(first difference at token {', '.join('-' if f is None else str(f) for _, f in shares)})")
    return result


class _Printer:
    """Streams one sequence's text to `echo` as it is decoded (on_text of `Model.generate`)."""

    def __init__(self, echo):
        self.echo, self.started = echo, False

    def __call__(self, pieces: list[str]) -> None:
        text = pieces[0]
        if not self.started:
            text, self.started = text.lstrip(), True
        if text:
            self.echo(text, end="", flush=True)

    def finish(self) -> None:
        self.echo("")


def _size_line(kind: str, kv: np.ndarray, bf16_kv: np.ndarray, config: HyQuantConfig, model_cfg) -> str:
    """The KV cache at the end against bf16, honest when the quantized cache is the larger one."""
    head = "KV cache at the end (all layers, per sequence):"
    if kind == "bf16":  # the bf16 run is its own yardstick: no ratio to print
        return f"{head} bf16 {_fmt_bytes(bf16_kv)}"
    line = f"{head} bf16 {_fmt_bytes(bf16_kv)}, {kind} {_fmt_bytes(kv)}"
    ratio = float(bf16_kv.sum() / kv.sum())
    if ratio >= 1:
        return f"{line} ({ratio:.2f}x smaller)"
    line += f" ({1 / ratio:.2f}x larger than bf16 here)"
    if kind != "hyquant":
        return line + ": its bf16 window holds more tokens than this short context"
    first = smaller_than_bf16_from(config, model_cfg.num_kv_heads, model_cfg.head_dim)
    reason = (f":\n    the hybrid cache always holds its {config.ring_size}-token bf16 window ring, so it is a fixed "
              f"minimum of {_fmt_mib(_ring_bytes(config, model_cfg))} for this model")
    return line + reason + (f"; it is smaller than bf16 from {first} cached tokens on" if first else "")


def _ring_bytes(config: HyQuantConfig, model_cfg) -> int:
    """Bytes of the window ring over all layers (bf16 keys and values of ring_size tokens)."""
    return config.ring_size * model_cfg.kv_bytes_per_token(2)


def _config_dict(config: HyQuantConfig) -> dict:
    return {k: (float(v) if isinstance(v, float) else v) for k, v in dataclasses.asdict(config).items()}


def _to_stderr(*args, **kwargs) -> None:
    kwargs["file"] = sys.stderr
    print(*args, **kwargs)


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


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.2f}M"


def _fmt_mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _fmt_bytes(x: np.ndarray) -> str:
    vals = [_fmt_mib(v) for v in np.asarray(x).tolist()]
    return vals[0] if len(vals) == 1 else "[" + ", ".join(vals) + "]"
