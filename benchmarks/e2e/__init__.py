"""End-to-end decode benchmark: Qwen3-8B/32B-shaped model with random bf16 weights, bf16 vs HyQuant vs KIVI.

The same model code and the same jitted `hyquant_jax.generate.decode` loop
(`lax.while_loop`, per-layer caches donated and updated in place) run with
each KV cache; only the cache and its attention differ:
  bf16     exact attention over a preallocated bf16 cache (XLA einsum decode)
  hyquant  HybridKVCache + hyquant_jax.decode_step (Pallas kernel on GPU)
  kivi4/kivi2/uniform4  quantized HybridKVCache, dequantize then attend (XLA)

Sections (each method runs in its own subprocess, so peak memory is per
method and an out-of-memory error ends only that method's sweep):
  b1       B = 1 decode at each of --prefixes (paper Table 8)
  batch    decode at --batch-prefix for B = --batches until out of memory,
           with peak GPU memory (paper Table 6)
  prefill  time of `hyquant_jax.generate.prefill` (B = 1) at --prefill-prefixes,
           the whole prompt at once (hyquant: hybrid prefill + Freeze) or
           with --prefill-chunk in chunks (every method: exact attention over
           the prompt so far, then VTI + Freeze for hyquant)
Decode caches are built directly from random keys/values (Freeze for the
quantized caches, sized for prompts of the prefix's length, `freeze(...,
min_length=prefix)`, as bf16's is sized for prefix + steps; a batch tiles
one sequence's cache), not by running the
prefill, so every prefix costs one decode compilation only. Each decode
config runs --steps steps once to compile and warm up, then --reps timed
loops of --steps steps; per-step time = median loop time / steps (inside
jit, no dispatch gaps). The median leaves out a once-per-call cost: with the
Mosaic kernel in the graph, the first timed call runs slower than the next
ones (docs/design.md, "Device loops and command buffers"); `step_ms_mean`,
the mean over all timed steps, keeps it. A cache with a window ring
(hyquant, KIVI, uniform) flushes each sequence's oldest block every
block_size steps (64 for hyquant): --steps should be a multiple of that, so
that every timed loop holds the same number of flushes (a warning
otherwise). The byte floor of a step is (weights read + KV cache
bytes) / --bandwidth-tbs: weights are every parameter except the embedding
table (only B rows of it are read); KV bytes are the cache's used bytes
(bf16: 2 * layers * Hkv * D * 2 bytes per token).

Several GPUs (--mesh data=D,model=M, `hyquant_jax.sharding`): weights are
split Megatron-style over M GPUs (attention by KV heads) and created
directly in that layout, caches are split by batch over D and by KV heads
over M, and every layer's attention (the Pallas kernels included) runs per
shard under shard_map. Each section then runs B = D sequences where it says
B = 1 (one per data shard); batch sizes must be multiples of D. Weights read
per step and the byte floor are per device: (the device's weight shards +
KV bytes / (D * M)) / bandwidth; all-reduce time is not in the floor. Peak
memory is the largest over the mesh's devices.

Writes OUT/e2e_<device>.json and .png (--name changes the stem; OUT is benchmarks/results by default).
Run on the GPU box from the repository root (the package need not be installed):
  python -m benchmarks.e2e --out benchmarks/results
Every decode config compiles the 36-layer decode loop once (tens of seconds),
so the whole default sweep takes well over 10 minutes; split it with
--sections / --methods / --prefixes / --batches, e.g. a short run:
  python -m benchmarks.e2e --out $OUT --name part1 --sections b1,prefill --prefixes 1024,32768 \\
      --prefill-prefixes 32768 --steps 32 --reps 2
  python -m benchmarks.e2e --out $OUT --name part2 --sections batch --batches 1,16,32 \\
      --no-until-oom --steps 16 --reps 2
then merge the parts (here, on any machine):
  python -m benchmarks.e2e --out benchmarks/results --combine part1.json part2.json
Qwen3-32B shape (64 layers, hidden 5120, 64/8 heads, FFN 25600) on 2 GPUs, e.g.:
  python -m benchmarks.e2e --out $OUT --name q32_tp2_b1 --model qwen3-32b --mesh data=1,model=2 \\
      --sections b1 --prefixes 32768 --methods bf16,hyquant --steps 32 --reps 2
CPU check that the script works: python -m benchmarks.e2e --smoke --out /tmp/e2e
(add --mesh data=2,model=2: the smoke run then asks XLA for 4 virtual CPU devices)

Modules: options (flags, model shape, each method's attention), placement (mesh), states (decode caches),
decode and prefill (the timed sections), worker (one section and method), run (the parent, --combine),
tables (printed tables and plot).
"""
