"""Which values does XLA copy in the decode loop? (issue 5: hyquant's per-step `memcpy32_post` copies)

The B=1 step profile (`results/profile_e2e_h200_s23_b1.json`) shows ~118 small device-to-device copies per
hyquant step (~3.3 per layer, ~1 us each) that the bf16 step does not have. This script compiles the jitted
decode loop of `hyquant_jax.generate` for a few-layer model of Qwen3-8B's attention shapes (small vocabulary
and MLP: they do not change the attention's state) and lists every `copy` in the optimized HLO of the while
body, with its shape and the JAX op it came from, for bf16 and for hyquant, and every instruction of the body
that launches work (`launches`: fusions, custom calls, copies...), to put JAX ops to the kernel names of a
step profile. Compiling only; nothing is timed.

  PYTHONPATH=. python benchmarks/decode_hlo_copies.py --out DIR [--layers 2] [--prefix 1024]

On a machine without a GPU hyquant runs its Pallas kernels in interpret mode, so the copies listed there are
the CPU pipeline's, not necessarily the GPU's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hyquant_jax as hq  # noqa: E402
import models  # noqa: E402
from benchmarks.common import environment, write_json  # noqa: E402
from hyquant_jax.sampling import SamplingConfig  # noqa: E402
from models.config import ModelConfig  # noqa: E402
from models.transformer import init_params  # noqa: E402

generate_module = importlib.import_module("hyquant_jax.generate")  # the package exports the function

COPY = re.compile(r"(%[\w.\-]+) = (\S+) copy\((%[\w.\-]+)\)")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def while_bodies(hlo: str) -> list[str]:
    """Names of the computations used as the body of a `while` instruction."""
    return sorted(set(re.findall(r"\bwhile\(.*?body=(%[\w.\-]+)", hlo)))


def computation(hlo: str, name: str) -> str:
    """The text of one computation of an HLO module dump."""
    start = re.search(rf"^(?:ENTRY )?{re.escape(name)} ", hlo, re.M)
    if start is None:
        raise ValueError(f"no computation {name} in the HLO text")
    end = hlo.find("\n}\n", start.start())
    return hlo[start.start():end]


def copies(text: str) -> list[dict]:
    """Every `copy` instruction of an HLO text: name, shape, operand and the JAX op it came from."""
    out = []
    for line in text.splitlines():
        m = COPY.search(line)
        if m:
            op = OP_NAME.search(line)
            out.append(dict(name=m.group(1), shape=m.group(2), operand=m.group(3), op=op.group(1) if op else ""))
    return out


LAUNCH = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (.+?) (fusion|custom-call|copy|conditional|scatter|gather|"
                    r"dynamic-update-slice)\(")
FUSION_KIND = re.compile(r"kind=(\w+)")
TARGET = re.compile(r'custom_call_target="([^"]*)"')


def launches(text: str) -> list[dict]:
    """The top-level instructions of an HLO computation that become GPU launches or copies (fusions, custom
    calls, copies, conditionals and unfused scatters, gathers, dynamic-update-slices): name, opcode, fusion
    kind or custom-call target, and the JAX op it came from. The names match the profiler's kernel names with
    '.' as '_' (e.g. %loop_pad_fusion.35 is loop_pad_fusion_35)."""
    out = []
    for line in text.splitlines():
        m = LAUNCH.match(line)
        if not m:
            continue
        kind = FUSION_KIND.search(line) if m.group(3) == "fusion" else TARGET.search(line)
        op = OP_NAME.search(line)
        out.append(dict(name=m.group(1), opcode=m.group(3), kind=kind.group(1) if kind else "",
                        op=op.group(1) if op else ""))
    return out


CONDITIONAL = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = .* conditional\(")
BRANCHES = re.compile(r"(?:true_computation|false_computation)=(%[\w.\-]+)|branch_computations=\{([^}]*)\}")


def branch_launches(hlo: str, text: str) -> dict:
    """For each `conditional` of an HLO computation's text: {its name: {branch computation: launches}}
    (e.g. the decode loop's window-flush `lax.cond`)."""
    out = {}
    for line in text.splitlines():
        m = CONDITIONAL.match(line)
        if not m:
            continue
        names = []
        for true_or_false, listed in BRANCHES.findall(line):
            names += [true_or_false] if true_or_false else re.findall(r"%[\w.\-]+", listed)
        out[m.group(1)] = {name: len(launches(computation(hlo, name))) for name in names}
    return out


def decode_hlo(kind: str, layers: int, prefix: int, backend: str) -> str:
    """Optimized HLO text of the jitted decode loop for a Qwen3-8B-attention-shaped model, B=1."""
    config = ModelConfig(architecture="qwen3", vocab_size=1024, hidden_size=4096, intermediate_size=1024,
                         num_layers=layers, num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True,
                         max_position=prefix + 1024)
    params = init_params(jax.random.PRNGKey(0), config)
    attention = models.BF16Attention() if kind == "bf16" else hq.make_attention("hyquant", backend=backend)
    tokens = jnp.ones((1, prefix), jnp.int32)
    lengths = jnp.array([prefix], jnp.int32)
    key = jax.random.PRNGKey(0)
    static = dict(config=config, attention=attention, sampling=SamplingConfig())
    first, _, states = generate_module.prefill(params, tokens, lengths, key, chunk=2048, max_len=prefix + 64,
                                               **static)
    lowered = generate_module.decode.lower(params, states, first, lengths, key, max_new_tokens=8, eos_ids=(),
                                           pad_id=0, **static)
    return lowered.compile().as_text()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".")
    p.add_argument("--name", default="decode_hlo_copies")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--prefix", type=int, default=1024)
    p.add_argument("--backend", default="auto", help="hyquant decode backend (auto: kernels on a GPU, "
                                                    "interpret mode elsewhere)")
    args = p.parse_args()
    if args.layers < 1 or args.prefix < 1:
        p.error("--layers and --prefix must be >= 1")
    os.makedirs(args.out, exist_ok=True)
    backend = args.backend
    if backend == "auto" and jax.devices()[0].platform != "gpu":
        backend = "interpret"
    result = dict(environment=environment(), command=" ".join(sys.argv), layers=args.layers, prefix=args.prefix,
                  backend=backend, methods={})
    for kind in ("bf16", "hyquant"):
        hlo = decode_hlo(kind, args.layers, args.prefix, backend)
        with open(os.path.join(args.out, f"{args.name}_{kind}.hlo.txt"), "w") as f:
            f.write(hlo)
        bodies = {name: copies(computation(hlo, name)) for name in while_bodies(hlo)}
        result["methods"][kind] = dict(while_bodies=bodies, total=sum(len(c) for c in bodies.values()),
                                       launches={name: launches(computation(hlo, name)) for name in bodies})
        for name, found in bodies.items():
            print(f"{kind} {name}: {len(found)} copies")
            for c in found:
                print("   ", json.dumps(c)[:200])
    write_json(os.path.join(args.out, args.name + ".json"), result)


if __name__ == "__main__":
    main()
