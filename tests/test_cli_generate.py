"""The `hyquant generate / bench / eval` commands."""

import argparse
import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import pytest

from hyquant_jax import cli
from hyquant_jax.cli import generate as generate_command
from hyquant_jax.cli import options, scripts
from hyquant_jax.config import HyQuantConfig
from models import ModelConfig, init_model
from tests.helpers.checkpoint_files import train_tokenizer, write_gguf


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
                   "--prefill-block", "16", "--compare-bf16",
                   "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "=== hyquant" in text and "=== bf16" in text and "identical to the bf16 run" in text
    assert "tokens/s" in text and "KV cache at the end" in text
    # the hyquant run's ratio (larger: these prompts are shorter than its window ring); none for the bf16 run
    assert text.count("x smaller") + text.count("x larger than bf16 here") == 1
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
    rc = cli.main(["generate", "-m", str(path), "-p", "Hello world! The quick brown fox", "-n", "4", "--window", "16",
                   "--block-size", "16", "--prefill-block", "16", "--compare-bf16"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "=== hyquant" in text and "=== bf16" in text and "identical to the bf16 run" in text


def test_generate_baseline_without_compare(tiny_gguf, capsys):
    path, _ = tiny_gguf
    rc = cli.main(["generate", "--model", str(path), "--raw", "--prompt", "Hello", "--max-new-tokens", "3",
                   "--attention", "kivi2", "--temperature", "0.8", "--top-k", "5"])
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


def _on_cpu():
    return jax.devices()[0].platform == "cpu"


BAD_INPUTS = [  # (arguments, what the one-line error must say); tmp stands for a fresh folder
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-k", "-2"], "--top-k must be an int >= 0"),
    (["-n", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--prefill-chunk", "0"], "--prefill-chunk must be >= 1"),
    (["--attention", "bf16", "--key-bits", "8"], "--key-bits sets the hybrid cache and applies to --attention "
                                                 "hyquant only, not --attention bf16 (the baselines' bits are in their "
                                                 "names"),
    (["-a", "kivi4", "--rho", "0.1", "--window", "64"], "--window, --rho set the hybrid cache and apply to --attention "
                                                        "hyquant only, not --attention kivi4"),
    (["-a", "uniform8", "--backend", "reference"], "--backend sets the hybrid cache"),
    (["--rho", "1.5"], "rho"),
    (["--window", "100"], "window"),
    (["--json", "{tmp}/no/such/folder/out.json"], "the folder {tmp}/no/such/folder does not exist"),
    (["--json", "{tmp}"], "is a folder; give a file path"),
    (["--prompt-file", "{tmp}/missing.txt"], "--prompt-file {tmp}/missing.txt does not exist"),
    (["--prompt-file", "{tmp}"], "--prompt-file {tmp} is a folder, not a text file"),
    (["-m", "{tmp}/missing.gguf"], "--model {tmp}/missing.gguf does not exist"),
    (["--mesh", "data=1,model=3"], "model"),
]
if _on_cpu():
    BAD_INPUTS += [(["--backend", "triton"], "--backend triton compiles the Pallas kernels for an NVIDIA GPU"),
                   (["--backend", "mosaic"], "--backend mosaic needs a Hopper GPU")]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_generate_refuses_bad_input_before_loading(args, message, tmp_path, capsys, monkeypatch):
    """Each bad option is one line on stderr, exit code 2, before the model loads or anything compiles."""
    import time

    monkeypatch.setattr(generate_command, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    t0 = time.perf_counter()
    assert cli.main(["generate", "--no-compile-cache", *args]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t0 < 15
    assert err.startswith("hyquant: error: ") and err.count("\n") == 1, err
    assert message.replace("{tmp}", str(tmp_path)) in err, err


def test_generate_refuses_a_bad_prompt_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(generate_command, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    assert cli.main(["generate", "-f", str(bad)]) == 2
    assert "is not a readable UTF-8 text file" in capsys.readouterr().err


def test_version_and_short_flags(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("hyquant 0.1.0 (jax 0.11.2")
    parser = _subparser("generate")
    args = parser.parse_args(["-m", "x.gguf", "-p", "hi", "-n", "3", "-a", "bf16", "-f", "p.txt"])
    assert (args.model, args.prompt, args.max_new_tokens, args.attention, args.prompt_file) == (
        "x.gguf", ["hi"], 3, "bf16", ["p.txt"])


def test_the_hyquant_settings_are_the_config_fields(monkeypatch):
    """Each HyQuantConfig field declared as an option is one (dest: the field name, its default in the help);
    none given is HyQuantConfig(); a bool field's flag sets the opposite of its default."""
    monkeypatch.setenv("COLUMNS", "2000")
    fields = {f.name: f for f in dataclasses.fields(HyQuantConfig)}
    assert set(options.CONFIG_OPTIONS) == {n for n, f in fields.items() if f.metadata["option"] is not None}
    assert set(options.CONFIG_OPTIONS) < set(fields)  # group_size is declared off the command line
    for command in ("generate", "demo"):
        parser = _subparser(command)
        actions = {a.dest: a for a in parser._actions}
        for name, flag in options.CONFIG_OPTIONS.items():
            assert actions[name].option_strings == [flag] and actions[name].default is None
            if not isinstance(fields[name].default, bool):
                assert actions[name].help.endswith(f"(default: {fields[name].default})"), name
        assert options.config_from_args(parser.parse_args([])) == HyQuantConfig()
    args = _subparser("generate").parse_args(["--no-promote", "--key-bits", "8", "--window", "64"])
    assert options.config_from_args(args) == HyQuantConfig(promote_flushed=False, key_bits=8, window=64)
    assert options.given_config_options(args) == ["--key-bits", "--window", "--no-promote"]


def test_demo_on_small_shapes(tmp_path, capsys):
    """`hyquant demo` freezes, decodes and reports the cache of its synthetic prompt, also as JSON."""
    out = tmp_path / "demo.json"
    rc = cli.main(["demo", "--prompt-len", "192", "--steps", "40", "--batch", "1", "--q-heads", "2", "--kv-heads",
                   "1", "--head-dim", "32", "--window", "32", "--block-size", "16", "--prefill-block", "16",
                   "--backend", "reference", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "HyQuant demo: B=1 Hq/Hkv=2/1 D=32, prompt 192 + 40 decoded tokens, K4V4 channel_key, W=32" in text
    record = json.loads(out.read_text())
    assert record["final_layout"]["length"] == 232 and record["config"]["window"] == 32
    layout = record["final_layout"]
    assert layout["window_tokens"] >= 32  # the window holds at least W tokens after a flush
    assert 0 < record["rel_error_vs_exact"]["hybrid_mean"] < 0.5
    assert f"cache of sequence 0: 232 tokens = {layout['pages']} low-bit pages" in text
    assert cli.main(["demo", "--window", "24"]) == 2 and "window" in capsys.readouterr().err


def test_demo_and_eval_help_state_their_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")
    demo = _subparser("demo").format_help()
    assert "(default: 2048)" in demo and "(default: 256)" in demo and "(default: 4)" in demo
    assert "accuracy --quick" in _subparser("eval").format_help()
    assert "bench e2e" in _subparser("bench").format_help()


def test_generate_streams_and_writes_one_json_record_to_stdout(tiny_gguf, capsys):
    """--json -: stdout is one JSON record (with the environment, as the results files record it) and the text
    goes to stderr; without it, one prompt streams to stdout and the size line is honest for a short prompt."""
    path, _ = tiny_gguf
    rc = cli.main(["generate", "-m", str(path), "-p", "Hello world! The quick brown fox", "-n", "5", "--window",
                   "16", "--block-size", "16", "--prefill-block", "16", "--no-compile-cache", "--json", "-"])
    assert rc == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert set(record["environment"]) >= {"device", "jax", "date", "command"} and record["config"]["window"] == 16
    assert "=== hyquant" in captured.err
    rc = cli.main(["generate", "-m", str(path), "-p", "Hello world! The quick brown fox", "-n", "5",
                   "--no-compile-cache"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "larger than bf16 here" in out and "192-token bf16 window ring" in out and "cached tokens on" in out


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
    assert listed == list(scripts.BENCHMARKS)
    assert cli.main(["eval"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == list(scripts.EVALUATIONS)
    assert cli.main(["eval", "no_such_eval"]) == 2
    assert "no eval script named 'no_such_eval'" in capsys.readouterr().err
    assert cli.main(["bench", "e2e", "--help"]) == 0


@pytest.mark.slow
def test_generate_default_model(capsys, default_model):
    """The README's main command on the default SmolLM2 (shortened to 8 new tokens)."""
    assert cli.main(["generate", "--compare-bf16", "--max-new-tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in text and "identical to the bf16 run" in text
    assert "x smaller" in text


def test_default_prompt_is_long_enough_to_compress():
    assert len(generate_command.default_prompt().split()) > 4 * HyQuantConfig().window  # most tokens leave the window
