"""The edges a user hits: every bad argument of `hyquant` and of the Python API is one line (exit code 2) before
the model loads, Ctrl-C is "interrupted" (exit code 130), a JSON record is never lost or half-written, and a
streamed run stops at the requested steps.

Each trial is a row of a table: the command line (or the Python call), the exit code, the words the message must
contain and whether it fails before the model loads (the loader is replaced by one that fails the test)."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import hyquant_jax as hq
from hyquant_jax import api, cli
from hyquant_jax.cli import demo as demo_command
from hyquant_jax.cli import generate as generate_command
from hyquant_jax.cli.output import ResultFile
from hyquant_jax.model_attention import make_attention
from models import ModelConfig, init_model
from tests.helpers.checkpoint_files import train_tokenizer, write_gguf

ROOT = Path(__file__).resolve().parents[1]
ON_CPU = jax.devices()[0].platform == "cpu"
GREEDY_WARNING = "has no effect with greedy decoding (--temperature 0)"

# (arguments, exit code, words the stderr must contain). The model never loads: the loader is replaced by one that
# fails the test, or, for the rows of exit code 130, by a Ctrl-C (KeyboardInterrupt) while it loads.
CLI_TRIALS = [
    (["generate", "--seed", "99999999999999999999999"], 2,
     ["hyquant generate: error: argument --seed: must be an integer in 0 .. 2**32 - 1", "see hyquant generate --help"]),
    (["generate", "--seed", "-1"], 2, ["argument --seed", "got '-1'"]),
    (["generate", "-n", "x"], 2, ["argument -n/--max-new-tokens: invalid int value: 'x'", "--help"]),
    (["generate", "--no-such-option"], 2, ["unrecognized arguments: --no-such-option", "see hyquant --help"]),
    ([], 2, ["the following arguments are required: command", "see hyquant --help"]),
    (["generate", "--prefill-chunk", "0"], 2, ["--prefill-chunk must be >= 1 (tokens prefilled per call), got 0"]),
    (["generate", "--mesh", "data=1,model=one"], 2, ["error: --mesh shape 'data=1,model=one'", "positive integer"]),
    (["generate", "--mesh", "data=1,rows=2"], 2, ["error: --mesh shape 'data=1,rows=2': unknown axis 'rows'"]),
    (["generate", "--json", "/proc/out.json"], 2, ["--json /proc/out.json: cannot create a file in /proc"]),
    (["generate", "--json", "{tmp}"], 2, ["is a folder; give a file path"]),
    (["demo", "--json", "/proc/out.json"], 2, ["--json /proc/out.json: cannot create a file in /proc"]),
    (["demo", "--kv-heads", "3"], 2, ["--kv-heads 3 must divide --q-heads 8"]),
    (["demo", "--batch", "0"], 2, ["--batch must be >= 1, got 0"]),
    (["demo", "--head-dim", "0"], 2, ["--head-dim must be >= 1, got 0"]),
    (["demo", "--head-dim", "33"], 2, ["--head-dim 33", "multiple of 2 for 4-bit packing"]),
    (["demo", "--steps", "-1"], 2, ["--steps must be >= 1, got -1"]),
    (["demo", "--prompt-len", "0"], 2, ["--prompt-len must be >= 1, got 0"]),
    (["demo", "--q-heads", "0"], 2, ["--q-heads must be >= 1, got 0"]),
    (["generate", "--top-p", "0.5"], 130, ["hyquant: warning: --top-p " + GREEDY_WARNING, "interrupted"]),
    (["generate", "--top-k", "100000000"], 130, ["hyquant: warning: --top-k " + GREEDY_WARNING, "interrupted"]),
    (["generate", "--top-k", "5", "--temperature", "0.7"], 130, ["interrupted"]),
]
if ON_CPU:
    CLI_TRIALS += [(["generate", "--backend", "triton"], 2, ["--backend triton compiles the Pallas kernels for an "
                                                             "NVIDIA GPU; this machine runs on cpu"]),
                   (["demo", "--backend", "mosaic"], 2, ["--backend mosaic needs a Hopper GPU"])]
if jax.device_count() < 2:
    CLI_TRIALS += [(["generate", "--mesh", "data=1,model=2"], 2, ["error: --mesh data=1,model=2 needs 2 devices"])]


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _fail_the_test(*args, **kwargs):
    pytest.fail("the model was loaded (or the demo ran) although the options are bad")


@pytest.mark.parametrize("argv, code, words", CLI_TRIALS, ids=[" ".join(a) or "(none)" for a, _, _ in CLI_TRIALS])
def test_cli_trial(argv, code, words, tmp_path, capsys, monkeypatch):
    """One line of error (after any warnings), the exit code, no traceback, and before anything loads or runs."""
    replacement = _interrupt if code == 130 else _fail_the_test
    monkeypatch.setattr(generate_command, "load", replacement)
    monkeypatch.setattr(demo_command, "run_demo", replacement)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    t0 = time.perf_counter()
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's errors leave through Parser.error
        rc = e.code
    assert time.perf_counter() - t0 < 5
    out, err = capsys.readouterr()
    assert rc == code, err
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len([line for line in lines if not line.startswith("hyquant: warning: ")]) == 1, err
    for word in words:
        assert word.replace("{tmp}", str(tmp_path)) in err, err
    if "--temperature" in argv:  # sampling: no warning about the sampling options
        assert "warning" not in err


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """Paths of two 2-layer llama GGUFs with one trained tokenizer: "short", whose context ends at 64 tokens, and
    "long" (4096)."""
    tok = train_tokenizer()
    folder = tmp_path_factory.mktemp("ckpt")
    paths = {}
    for name, max_position in (("short", 64), ("long", 4096)):
        config = ModelConfig("llama", vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                             num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position=max_position)
        paths[name] = folder / f"{name}.gguf"
        write_gguf(paths[name], init_model(jax.random.PRNGKey(0), config, jnp.float32), tokenizer=tok)
    return paths


@pytest.fixture(scope="module")
def short_model(gguf_files):
    return hq.load(gguf_files["short"])


# (keyword arguments of Model.generate, the words of the ValueError)
API_TRIALS = [
    ({"mesh": 3}, "mesh must be None, a jax.sharding.Mesh (make_mesh) or a shape such as 'data=1,model=2'"),
    ({"mesh": "data=1,model=one"}, "positive integer"),
    ({"chat": "no"}, "chat must be True or False, got 'no'"),
    ({"prefill_chunk": 0}, "prefill_chunk must be an int >= 1 (tokens prefilled per call), got 0"),
    ({"seed": 10**30}, "seed must be an integer in 0 .. 2**32 - 1 (4294967295), got 1000000000000000000000000000000"),
    ({"seed": "x"}, "seed must be an integer in 0 .. 2**32 - 1 (4294967295), got 'x'"),
    ({"seed": -1}, "seed must be an integer in 0 .. 2**32 - 1"),
    ({"max_new_tokens": True}, "max_new_tokens must be an int >= 1, got True"),
    ({"backend": "cuda"}, "backend must be one of"),
    ({"attention": "fp4"}, "attention must be one of"),
]
if ON_CPU:
    API_TRIALS += [({"backend": "triton"}, "backend='triton' compiles the Pallas kernels for an NVIDIA GPU"),
                   ({"backend": "mosaic"}, "backend='mosaic' needs a Hopper GPU")]
if jax.device_count() < 2:
    API_TRIALS += [({"mesh": "data=1,model=2"}, "mesh data=1,model=2 needs 2 devices")]


@pytest.mark.parametrize("kwargs, words", API_TRIALS, ids=[repr(k)[:40] for k, _ in API_TRIALS])
def test_api_trial(kwargs, words, short_model, monkeypatch):
    """Model.generate: a ValueError naming the argument, before anything is traced."""
    monkeypatch.setattr(api, "generate", _fail_the_test)
    kwargs = dict(kwargs)
    n = kwargs.pop("max_new_tokens", 2)
    with pytest.raises(ValueError) as e:
        short_model.generate(["Hello"], n, **kwargs)
    assert words in str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"seed": 10**30}, "seed must be an integer in 0 .. 2**32 - 1"),
    ({"mesh": "data=1,model=one"}, "positive integer"),
    ({"prefill_chunk": 0}, "prefill_chunk must be an int >= 1"),
])
def test_token_level_generate_checks_its_arguments(kwargs, words, short_model):
    with pytest.raises(ValueError) as e:
        hq.generate(short_model.decoder, [[1, 2, 3]], attention=make_attention("bf16", None), max_new_tokens=2,
                    **kwargs)
    assert words in str(e.value)


def test_api_warns_about_sampling_options_under_greedy(short_model, monkeypatch):
    monkeypatch.setattr(api, "generate", _interrupt)
    with pytest.warns(UserWarning, match=r"sampling\.top_p has no effect with greedy decoding"):
        with pytest.raises(KeyboardInterrupt):
            short_model.generate(["Hello"], 2, sampling=hq.SamplingConfig(top_p=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sampling for real: no warning
        with pytest.raises(KeyboardInterrupt):
            short_model.generate(["Hello"], 2, sampling=hq.SamplingConfig(temperature=0.7, top_k=5))


def test_api_load_checks_progress():
    with pytest.raises(ValueError, match="progress must be True or False, got 'yes'"):
        hq.load(progress="yes")


TINY = ["--window", "16", "--block-size", "16", "--prefill-block", "16"]


def test_generate_at_the_context_limit_streams_the_requested_steps(gguf_files, short_model, tmp_path, capsys):
    """A prompt that leaves n tokens of the context (n not a multiple of the streaming chunk): the streamed hyquant
    run and the unstreamed bf16 comparison run agree on steps, cached tokens and bf16 bytes, the default output
    prints one bf16 size, and n + 1 is refused with the n + 1 the user typed."""
    path, limit = gguf_files["short"], short_model.config.max_position
    text = "The quick brown fox jumps"
    prompt = len(short_model.prompt_ids([text], chat=False)[0])
    n = limit - prompt
    assert n % 16 and n > 16  # the last streamed call is a shorter one
    out = tmp_path / "limit.json"
    rc = cli.main(["generate", "-m", str(path), "-p", text, "--raw", "-n", str(n), *TINY, "--compare-bf16",
                   "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    streamed, whole = runs["hyquant"], runs["bf16"]
    assert streamed["decode_steps"] == whole["decode_steps"] == n - 1
    assert streamed["cached_tokens"] == whole["cached_tokens"] == [prompt + n - 1]
    assert streamed["kv_bytes_bf16"] == whole["kv_bytes_bf16"] == whole["kv_bytes"]
    assert [len(t) for t in streamed["tokens"]] == [len(t) for t in whole["tokens"]] == [n]
    sizes = {line.split(" bf16 ")[1].split(",")[0] for line in printed.splitlines() if "KV cache at the end" in line}
    assert len(sizes) == 1, printed
    assert printed.count(generate_command.TEXT_HEADER) == 2 and "\n---\n" not in printed

    rc = cli.main(["generate", "-m", str(path), "-p", text, "--raw", "-n", str(n + 1), *TINY])
    err = capsys.readouterr().err
    assert rc == 2 and f"max_new_tokens ({n + 1}) = {limit + 1} exceeds" in err, err


def test_generate_json_that_fails_at_write_time_goes_to_stdout(gguf_files, capsys):
    """/dev/full passes the up-front check and fails at the write: one line, the record on stdout, exit code 2."""
    rc = cli.main(["generate", "-m", str(gguf_files["long"]), "-p", "Hello", "-n", "3", "-a", "bf16", "--json",
                   "/dev/full"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "hyquant: error: could not write --json /dev/full (No space left on device); the record follows on " \
           "stdout" in err and "Traceback" not in err
    record = json.loads(out.splitlines()[-1])
    assert len(record["runs"]["bf16"]["tokens"][0]) == 3


def test_demo_json_that_fails_at_write_time_goes_to_stdout(capsys, monkeypatch):
    """The demo's record takes the same way (the demo itself replaced by a record: its compile is slow on a CPU;
    test_cli_generate.py runs it)."""
    monkeypatch.setattr(demo_command, "run_demo", lambda **kwargs: {"shapes": kwargs["batch"]})
    monkeypatch.setattr(demo_command, "describe", lambda result, config, backend: ["the demo's lines"])
    rc = cli.main(["demo", "--batch", "3", "--json", "/dev/full"])
    out, err = capsys.readouterr()
    assert rc == 2 and err == "hyquant: error: could not write --json /dev/full (No space left on device); the " \
                              "record follows on stdout\n"
    assert out == "the demo's lines\n" + json.dumps({"shapes": 3}) + "\n"


def test_ctrl_c_during_a_run_is_one_line(gguf_files, tmp_path):
    """SIGINT to a running `hyquant generate` (once its text header is out): "interrupted", exit code 130, no
    traceback, and no JSON file or temporary file left behind."""
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    run = subprocess.Popen([sys.executable, "-m", "hyquant_jax.cli", "generate", "-m", str(gguf_files["long"]), "-p",
                            "Hello", "-n", "4000", "-a", "bf16", "--json", str(out)],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in run.stdout:
            if line.startswith(generate_command.TEXT_HEADER):
                break
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert err.rstrip().endswith("interrupted") and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", [False, True])
def test_result_file_replaces_the_target_whole(tmp_path, existing, capsys):
    target = tmp_path / "r.json"
    if existing:
        target.write_text("old")
        target.chmod(0o640)
    assert ResultFile(target).prepare().write({"a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left
    if existing:
        assert target.stat().st_mode & 0o777 == 0o640
    assert capsys.readouterr() == ("", "")


def test_result_file_failure_keeps_the_old_file_and_prints_the_record(tmp_path, capsys, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert not ResultFile(target, "--out").write({"a": 1})
    out, err = capsys.readouterr()
    assert json.loads(out) == {"a": 1}
    assert err == f"hyquant: error: could not write --out {target} (No space left on device); the record follows " \
                  f"on stdout\n"
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_result_file_interrupted_mid_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")
    monkeypatch.setattr(os, "fsync", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        ResultFile(target).write({"a": 1})
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_result_file_to_stdout_is_one_line(capsys):
    assert ResultFile("-").prepare().write({"a": 1, "b": [2]})
    assert capsys.readouterr().out == '{"a": 1, "b": [2]}\n'


def test_result_file_refuses_an_unwritable_path_up_front(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    target.chmod(0o444)
    if os.access(target, os.W_OK):  # root writes anyway
        pytest.skip("running as root: every file is writable")
    with pytest.raises(ValueError, match="is not writable"):
        ResultFile(target).prepare()


def test_config_fields_reach_the_demo_check(capsys, monkeypatch):
    """The --head-dim check uses the given bits: 8-bit keys and values take any head_dim."""
    monkeypatch.setattr(demo_command, "run_demo", _interrupt)
    assert cli.main(["demo", "--head-dim", "33", "--key-bits", "8", "--value-bits", "8"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
