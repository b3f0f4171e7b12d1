"""benchmarks/ruler_eval.py on the tiny checkpoint: every method on two short prompts, the records' fields and
invariants (bf16's KL to itself is 0, the byte counts of the formats, equal-byte controls near their target), the
summary's intervals, a resumed run that adds nothing; and the one loop it greedy-decodes and teacher-forces with.
The end-to-end tests are marked slow: every method compiles its own decode loop (about 2 CPU-minutes)."""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import ruler_eval  # noqa: E402

LENGTH = 768


@pytest.fixture(scope="module")
def essays(tmp_path_factory):
    """Two essays of pseudo-words, ~4,000 words."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted({"".join(rng.choice(letters, rng.integers(4, 9))) for _ in range(600)})
    folder = tmp_path_factory.mktemp("essays")
    for i in range(2):
        sentences = [" ".join(rng.choice(vocab, rng.integers(6, 12))).capitalize() + "." for _ in range(200)]
        (folder / f"essay{i}.txt").write_text(" ".join(sentences))
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """(path, config) of a 1-layer llama GGUF with a trained BPE tokenizer (one layer: every method compiles its
    decode loop, and the compile time grows with the layers)."""
    from models import ModelConfig, init_model
    from tests.helpers.checkpoint_files import train_tokenizer, write_gguf

    tok = train_tokenizer()
    config = ModelConfig("llama", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=1, num_heads=4, num_kv_heads=2, head_dim=32, max_position=2048)
    path = tmp_path_factory.mktemp("ckpt") / "tiny1.gguf"
    write_gguf(path, init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok)
    return path, config


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model, essays):
    out = tmp_path_factory.mktemp("ruler")
    argv = ["--model", str(tiny_model[0]), "--lengths", str(LENGTH), "--samples", "2", "--tasks", "niah_single",
            "--out", str(out), "--summary", str(out / "summary.json"), "--essays", str(essays),
            "--max-new-tokens", "6", "--dtype", "float32"]
    with jax.default_matmul_precision("highest"):
        assert ruler_eval.main(argv) == 0
    return argv, out


@pytest.mark.slow
def test_every_method_has_a_complete_record(run, tiny_model):
    _, out = run
    records = ruler_eval.read_records(out / ruler_eval.RECORDS)
    assert sorted((r["key"], r["method"]) for r in records) == sorted(
        (f"niah_single/{LENGTH}/{i}", m) for i in range(2) for m in ruler_eval.METHODS)
    config = tiny_model[1]
    for r in records:
        n = r["answer_tokens"]
        assert len(r["answer_logprob"]) == len(r["answer_top1"]) == len(r["answer_kl"]) == n > 1
        assert all(x <= 0.0 for x in r["answer_logprob"]) and all(k >= 0.0 for k in r["answer_kl"])
        assert r["answer_kl"][0] == 0.0  # the first answer token comes from the shared prefill
        assert 0.0 <= r["score"] <= 1.0 and r["exact"] == float(r["score"] == 1.0)
        assert LENGTH - 100 <= r["prompt_tokens"] <= LENGTH
        assert r["allocated_bytes_per_token"] >= r["bytes_per_token"] > 0
    by = {(r["key"], r["method"]): r for r in records}
    per_elem = 2 * config.num_layers * config.num_kv_heads * config.head_dim  # K and V elements per token
    for key in {r["key"] for r in records}:
        bf16 = by[(key, "bf16")]
        assert bf16["answer_kl"] == [0.0] * bf16["answer_tokens"]
        assert bf16["bytes_per_token"] == 2 * per_elem
        assert by[(key, "fp8")]["bytes_per_token"] == per_elem + 2 * 2 * config.num_layers * config.num_kv_heads
        b = {m: by[(key, m)]["bytes_per_token"] for m in ruler_eval.METHODS}
        assert b["uniform2"] < b["uniform4"] < b["uniform8"] < b["bf16"]
        assert b["hyquant_k2v2"] < b["hyquant_k2v4"] == b["hyquant_k4v2"] < b["hyquant_k4v4"]
        assert b["kivi4"] < b["hyquant_k4v4"]
        for control in ("kivi4_eq_k4v4", "hyquant_k4v4_rho0_eq_k4v4"):  # within a window step of the target
            assert abs(b[control] - b["hyquant_k4v4"]) <= 64 * 2 * per_elem / LENGTH, control


@pytest.mark.slow
def test_summary_intervals_contain_their_means(run):
    _, out = run
    summary = json.loads((out / "summary.json").read_text())
    cell = summary["lengths"][str(LENGTH)]
    assert set(cell) == set(ruler_eval.METHODS)
    assert cell["bf16"]["kl"] == 0.0 and "minus_bf16" not in cell["bf16"]
    intervals = [iv for name, m in cell.items() for group in ("minus_bf16", "hyquant_k4v4_minus")
                 for iv in m.get(group, {}).values()] + [m["kl_interval"] for n, m in cell.items() if n != "bf16"]
    assert len(intervals) == 12 * 4 + 12 * 5 + 12
    for iv in intervals:
        assert iv["units"] == 2 and iv["low"] - 1e-12 <= iv["mean"] <= iv["high"] + 1e-12


@pytest.mark.slow
def test_a_resumed_run_adds_nothing(run):
    argv, out = run
    before = (out / ruler_eval.RECORDS).read_text()
    assert ruler_eval.main(argv) == 0
    assert (out / ruler_eval.RECORDS).read_text() == before


def test_pilot_keeps_the_cells_in_the_band():
    records = [{"method": "bf16", "task": t, "length": 512, "score": s} for t, scores in
               (("a", [1, 1, 0, 1]), ("b", [1, 1, 1, 1]), ("c", [0, 0, 0, 1])) for s in scores]
    pilot = ruler_eval.pilot_cells(records)
    assert pilot["selected"] == [["a", 512]]
    assert [c["bf16_score"] for c in pilot["cells"]] == [0.75, 1.0, 0.25]


def test_bad_methods_are_named():
    with pytest.raises(SystemExit):
        ruler_eval.parse_args(["--out", "/tmp/x", "--methods", "kivi3"])
    assert ruler_eval.check_method("kivi2_eq_k2v4") == "kivi2_eq_k2v4"


def test_greedy_and_forced_match_generate_and_the_teacher_forced_nll():
    from hyquant_jax.eval import greedy_and_forced, teacher_forced_nll
    from hyquant_jax.generate import decode
    from hyquant_jax.model_attention import make_attention
    from hyquant_jax.sampling import SamplingConfig
    from models import ModelConfig, PrefillContext, init_model, split_model

    config = ModelConfig("llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=32, max_position=512)
    model = init_model(jax.random.PRNGKey(0), config, jnp.float32)
    att = make_attention("kivi2", cache_dtype=jnp.float32)  # a cache whose ring flushes within the steps
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, 96, (1, 100)), jnp.int32)
    forced = jnp.asarray(np.random.default_rng(1).integers(0, 96, (40,)), jnp.int32)
    lengths, max_len = jnp.array([100], jnp.int32), 160
    ctx = PrefillContext(jnp.int32(0), lengths, max_len, whole=True)

    def prefill():
        empty = tuple(att.prefill_state(config, 1, 100, max_len, jnp.float32, True) for _ in range(2))
        logits, states = model(prompt, ctx, empty, attention=att, output_index=lengths - 1)
        return jnp.argmax(logits[0]).astype(jnp.int32), states

    first, states = prefill()
    greedy, logp = greedy_and_forced(*split_model(model), states, first, forced, lengths[0], attention=att)
    first, states = prefill()
    _, want, count, *_ = decode(*split_model(model), states, first[None], lengths, jax.random.PRNGKey(0),
                                attention=att, sampling=SamplingConfig(), max_new_tokens=41, eos_ids=(),
                                pad_id=0)
    np.testing.assert_array_equal(np.asarray(greedy), np.asarray(want[0]))
    _, states = prefill()
    nll, top1, _ = teacher_forced_nll(*split_model(model), states, forced[None], lengths, attention=att)
    logp = np.asarray(logp)
    assert logp.shape == (40, 96)
    np.testing.assert_allclose(np.exp(logp).sum(-1), 1.0, rtol=1e-5)
    got = -np.take_along_axis(logp[:39], np.asarray(forced[1:])[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(got, np.asarray(nll[0]), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(logp[:39].argmax(-1), np.asarray(top1[0]))
