"""The `hyquant generate / bench / eval` commands."""

import argparse
import json
import re

import jax
import jax.numpy as jnp
import pytest

from hyquant_jax import cli
from models import ModelConfig, init_model
from tests.helpers.checkpoint_files import train_tokenizer, write_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    tok = train_tokenizer()
    config = ModelConfig("llama", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position=4096)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.gguf"
    write_gguf(path, init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok)
    return path, config


def _subparser(name):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_generate_help_explains_every_option():
    parser = _subparser("generate")
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help text"


def test_generate_help_states_each_default_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # no wrapped words
    parser = _subparser("generate")
    text = parser.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    entries = {}  # option -> its help entry (the option line and, for long options, the next one)
    for entry in re.split(r"\n(?=  -)", text):
        entries[entry.split()[0]] = " ".join(entry.split())
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        line = entries[action.option_strings[0]]
        named = "default" in action.help
        appended = action.default is not None and action.default is not False and not named
        assert line.count("(default:") == int(named or appended), line
        if appended:
            assert line.endswith(f"(default: {action.default})"), line  # falsy numbers such as 0 stay


def test_generate_on_a_tiny_gguf(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    out = tmp_path / "result.json"
    rc = cli.main(["generate", "--model", str(path), "--prompt", "Hello world! The quick brown fox",
                   "--prompt", "def f(x):", "--max-new-tokens", "6", "--window", "16", "--block-size", "16",
                   "--prefill-block", "16",
                   "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "=== hyquant" in text and "=== bf16" in text and "identical to the bf16 run" in text
    assert "tokens/s" in text and "KV cache at the end" in text
    assert text.count("x smaller") == 1  # the hyquant run's ratio; the bf16 run prints no ratio to itself
    result = json.loads(out.read_text())
    assert 0.0 <= result["agreement_with_bf16"] <= 1.0
    assert len(result["runs"]["hyquant"]["tokens"]) == 2
    assert result["backend"] == ("triton" if jax.default_backend() == "gpu" else "reference")


def test_generate_on_a_tiny_qwen3_gguf(tmp_path, capsys):
    """A qwen3-architecture GGUF (q/k RMSNorm, Qwen2's pre-tokenizer) through the whole CLI."""
    tok = train_tokenizer()
    config = ModelConfig("qwen3", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position=4096, qk_norm=True)
    path = tmp_path / "tiny-qwen3.gguf"
    write_gguf(path, init_model(jax.random.PRNGKey(1), config, jnp.float32), arch="qwen3", tokenizer=tok,
               pre="qwen2")
    rc = cli.main(["generate", "--model", str(path), "--prompt", "Hello world! The quick brown fox",
                   "--max-new-tokens", "4", "--window", "16", "--block-size", "16", "--prefill-block", "16"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "=== hyquant" in text and "=== bf16" in text and "identical to the bf16 run" in text


def test_generate_baseline_without_compare(tiny_gguf, capsys):
    path, _ = tiny_gguf
    rc = cli.main(["generate", "--model", str(path), "--raw", "--prompt", "Hello", "--max-new-tokens", "3",
                   "--attention", "kivi2", "--no-compare", "--temperature", "0.8", "--top-k", "5"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "=== kivi2" in text and "=== bf16" not in text


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "missing.gguf", "does not exist"),
    (lambda tmp: (tmp / "junk.bin").write_bytes(b"junk!") and tmp / "junk.bin", "neither a Hugging Face folder"),
])
def test_generate_clear_errors(tmp_path, capsys, make, words):
    rc = cli.main(["generate", "--model", str(make(tmp_path)), "--max-new-tokens", "2"])
    assert rc == 2
    assert words in capsys.readouterr().err


def test_generate_checks_prompt_files_before_loading_the_model(tmp_path, capsys, monkeypatch):
    import models.checkpoint

    monkeypatch.setattr(models.checkpoint, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    missing = tmp_path / "missing.txt"
    assert cli.main(["generate", "--prompt-file", str(missing)]) == 2
    assert f"--prompt-file {missing} does not exist" in capsys.readouterr().err


def test_generate_unsupported_architecture(tiny_gguf, tmp_path, capsys):
    _, config = tiny_gguf
    bad = tmp_path / "gemma.gguf"
    write_gguf(bad, init_model(jax.random.PRNGKey(0), config, jnp.float32), arch="gemma")
    assert cli.main(["generate", "--model", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "gemma.gguf" in err and "general.architecture='gemma' is not supported" in err


def test_bench_and_eval_list_and_run_scripts(capsys):
    """`hyquant bench` / `eval` list exactly the documented scripts (each with its first docstring line)."""
    assert cli.main(["bench"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == list(cli.BENCHMARKS)
    assert cli.main(["eval"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["accuracy"]
    assert cli.main(["eval", "no_such_eval"]) == 2
    assert "no eval script named 'no_such_eval'" in capsys.readouterr().err
    assert cli.main(["bench", "e2e", "--help"]) == 0


@pytest.mark.slow
def test_generate_default_model(capsys):
    """The README's main command on the default SmolLM2 (shortened to 8 new tokens)."""
    from models import default_model_path

    try:
        default_model_path()
    except ValueError as e:
        pytest.skip(str(e))
    assert cli.main(["generate", "--max-new-tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in text and "identical to the bf16 run" in text
    assert "x smaller" in text


def test_default_prompt_is_long_enough_to_compress():
    from hyquant_jax.config import HyQuantConfig
    from hyquant_jax.generate_cli import default_prompt

    assert len(default_prompt().split()) > 4 * HyQuantConfig().window  # most tokens leave the window
