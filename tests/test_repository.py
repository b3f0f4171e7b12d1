"""The tracked tree speaks of the software only: no numbered work periods, issue numbers or period-numbered files.

History lives in git (docs/design.md says how to reach the archived experiments); a comment says why in the
present tense and points to a docs/design.md section where the reason is long.
"""

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PERIOD = re.compile(r"\bsessions?[ -]?\d", re.IGNORECASE)  # the word for a work period, then its number
ISSUE = re.compile(r"\bissues? #?\d", re.IGNORECASE)  # the word issue, then its number
PERIOD_FILE = re.compile(r"\b[A-Za-z][\w-]*_s\d{2}[a-z]?(?=[._/])")  # a file stem ending in _s and two digits


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in names.splitlines():
        path = ROOT / name
        if path.is_file() and b"\0" not in path.read_bytes()[:4096]:
            files.append(path)
    return files


def offending_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()
            if PERIOD.search(line) or ISSUE.search(line) or PERIOD_FILE.search(line)]


def test_the_patterns_catch_what_they_should():
    # The examples are assembled here so that this file passes its own check.
    period, issue, n = "session", "issue", 12
    for bad in (f"measured in {period} {n}", f"{period.title()}s {n}-{n + 4} timed it", f"see {issue} {n}",
                f"gpu_next_s{n}.sh", f"results/e2e_s{n}_b1.json", f"profile_graphs_s{n}.json",
                f"{period}-{n} kernel"):
        assert offending_lines(bad), bad
    for fine in ("s32[1] copy", "an int32 [B] counter", "issues of the tracker", "the sessions of a server",
                 "bf16_s32 x", "K4V4"):
        assert not offending_lines(fine), fine


def test_no_tracked_file_names_work_periods():
    found = []
    for path in tracked_text_files():
        for line in offending_lines(path.read_text(errors="replace")):
            found.append(f"{path.relative_to(ROOT)}: {line[:120]}")
        if PERIOD_FILE.search(path.name + "."):
            found.append(f"{path.relative_to(ROOT)}: period-numbered file name")
    assert not found, "\n".join(found[:40])


def test_results_folder_holds_only_canonical_files():
    """benchmarks/results holds `<benchmark>_<device>.json` files that report.py reads, and their plots."""
    from benchmarks.report import result_files

    results = ROOT / "benchmarks" / "results"
    read = {Path(p).name for devices in result_files(str(results)).values() for p in devices.values()}
    stems = {name[:-5] for name in read}
    for path in results.iterdir():
        if path.suffix == ".json":
            assert path.name in read, f"{path.name}: not a file report.py reads"
        else:
            assert path.suffix == ".png" and any(path.stem.startswith(s) for s in stems), f"{path.name}: not a plot"


def test_design_references_name_existing_sections():
    """Every `docs/design.md, "Section"` (or `docs/design.md ("Section")`) in the tree names a heading there."""
    headings = {line[3:].strip() for line in (ROOT / "docs" / "design.md").read_text().splitlines()
                if line.startswith("## ")}
    ref = re.compile(r"""docs/design\.md[,;:]?\s*\(?\s*"([^"]+)"|"([^"]+)"\s*\(?docs/design\.md""")
    missing = []
    for path in tracked_text_files():
        if path.name == Path(__file__).name:
            continue
        text = " ".join(path.read_text(errors="replace").split())  # references may wrap across lines
        text = re.sub(r"\s*#\s*", " ", text)  # and across comment lines
        for m in ref.finditer(text):
            name = m.group(1) or m.group(2)
            if name not in headings:
                missing.append(f"{path.relative_to(ROOT)}: {name!r}")
    assert not missing, f"unknown docs/design.md sections (headings: {sorted(headings)}):\n" + "\n".join(missing)


# Result files cited in the tree. A citation `benchmarks/results/<file>` names a file of the tree; one written
# `<commit>:<path>` (or `archive:<path>`, the same as ARCHIVE:<path>) names a file that lives only in git history.
# `*` and `{a,b}` may stand for several files; a name with `<...>` is a template, not a citation.
ARCHIVE = "9b31f7a"  # the commit that holds the experiment records (docs/design.md says what is there)
_PATH = r"[\w.*<>-]*(?:\{[\w.,-]*\}[\w.*<>-]*)*(?:/[\w.*<>-]*(?:\{[\w.,-]*\}[\w.*<>-]*)*)*"
IN_HISTORY = re.compile(r"(?<![\w/:])([0-9a-f]{7,40}|archive):([A-Za-z_]" + _PATH + ")")
RESULTS = re.compile(r"(?<![\w/:.-])benchmarks/results/" + _PATH)
GENERATED = {"docs/results.md"}  # written by benchmarks/report.py, quoting the commands recorded in result files


def cited_paths(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(tree paths, (commit, path) pairs) cited in `text`, templates left out, `{a,b}` expanded."""
    def expand(path: str) -> list[str]:
        m = re.search(r"\{([^}]*)\}", path)
        if not m:
            return [path.rstrip(".")]
        return [q for alt in m.group(1).split(",") for q in expand(path[:m.start()] + alt + path[m.end():])]

    history = {(ARCHIVE if c == "archive" else c, q) for c, p in IN_HISTORY.findall(text) if "<" not in p
               for q in expand(p)}
    tree = {q for p in RESULTS.findall(text) if "<" not in p for q in expand(p)}
    return tree, history


def missing_in_tree(paths, root: Path = ROOT) -> list[str]:
    return sorted(p for p in paths if not any(root.glob(p)))


def test_the_citation_patterns_catch_what_they_should():
    tree, history = cited_paths(
        "see `benchmarks/results/e2e_h200.json`, benchmarks/results/chunked_prefill_{h200,h100}.json, "
        "benchmarks/results/generate_*_cpu.json. `9b31f7a:benchmarks/results/a.patch`, archive:benchmarks/x.py "
        "`git show 7cbf3c9:models/attention.py`; templates benchmarks/results/<benchmark>_<device>.json and "
        "`9b31f7a:benchmarks/results/<name>.patch`")
    assert tree == {"benchmarks/results/e2e_h200.json", "benchmarks/results/chunked_prefill_h200.json",
                    "benchmarks/results/chunked_prefill_h100.json", "benchmarks/results/generate_*_cpu.json"}
    assert history == {(ARCHIVE, "benchmarks/results/a.patch"), (ARCHIVE, "benchmarks/x.py"),
                       ("7cbf3c9", "models/attention.py")}
    assert missing_in_tree(["benchmarks/results/generate_*_cpu.json", "benchmarks/results/e2e_h200.json"]) == []
    assert missing_in_tree(["benchmarks/results/generate_smollm2_cpu_*.json"])  # a file name of the past


def _citations() -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    """Each cited tree path and (commit, path) pair, with the tracked files that cite it."""
    tree, history = {}, {}
    for path in tracked_text_files():
        name = str(path.relative_to(ROOT))
        if name in GENERATED or name.startswith("benchmarks/results/") or path.name == Path(__file__).name:
            continue
        in_tree, in_history = cited_paths(path.read_text(errors="replace"))
        for p in in_tree:
            tree.setdefault(p, set()).add(name)
        for c in in_history:
            history.setdefault(c, set()).add(name)
    return tree, history


def test_cited_result_files_exist():
    """Every `benchmarks/results/...` file cited in a tracked file is in the tree (else cite it `<commit>:path`)."""
    tree, _ = _citations()
    missing = [f"{p} (cited in {', '.join(sorted(tree[p]))})" for p in missing_in_tree(tree)]
    assert not missing, "cited result files missing from the tree:\n" + "\n".join(missing)


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def test_files_cited_at_a_commit_exist_there():
    """Every `<commit>:<path>` citation names a file at that commit. A clone without that history (shallow, or
    no git) skips the commits it lacks; in a full clone an unknown commit fails."""
    _, history = _citations()
    shallow = (_git("rev-parse", "--is-shallow-repository") or "true").strip() != "false"
    listing, missing, lacked = {}, [], set()
    for commit, path in sorted(history):
        if commit not in listing:
            files = _git("ls-tree", "-r", "--name-only", commit)
            listing[commit] = None if files is None else files.splitlines()
        if listing[commit] is None and shallow:
            lacked.add(commit)
        elif not fnmatch.filter(listing[commit] or [], path):
            missing.append(f"{commit}:{path} (cited in {', '.join(sorted(history[commit, path]))})")
    assert not missing, "cited files missing at their commit:\n" + "\n".join(missing)
    if lacked:
        pytest.skip(f"commits not in this clone: {', '.join(sorted(lacked))}")


PACKAGES = ("hyquant_jax", "models", "pallas_kernels")


def _modules() -> list[str]:
    return sorted(f"{p.parent.name}.{p.stem}" if p.stem != "__init__" else p.parent.name
                  for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py"))


def test_every_module_imports_alone_and_in_any_order():
    """No import cycle: each module imports first in a fresh interpreter, and all of them in forward, reverse
    and shuffled order."""
    import random
    import sys

    mods = _modules()
    orders = [mods, mods[::-1], random.Random(0).sample(mods, len(mods))]
    script = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    for order in orders:
        proc = subprocess.run([sys.executable, "-c", script, *order], cwd=ROOT, capture_output=True, text=True,
                              env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_module_imports_a_private_name_of_another():
    import ast

    found = []
    for pkg in PACKAGES + ("benchmarks",):
        for path in (ROOT / pkg).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    own = node.module.split(".")[0] == pkg and node.module.endswith(path.stem)
                    private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"
                               and not (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists()]
                    if private and not own:
                        found.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(private)}")
    assert not found, "\n".join(found)


# Names cited in docs/architecture.md: `pkg.module.name`, `module.name` (a module of the tree by its own name;
# `hq` is hyquant_jax), `Class.member` after a module, file paths and `file.py`. Resolved by reading the files,
# without importing them: a name is defined in its module (def, class, an assignment, an annotated field) or
# imported into it (a package's re-export).
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ALIASES = {"hq": "hyquant_jax"}
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"[\w.<>*/-]+")
FILE_SUFFIXES = (".py", ".sh", ".md", ".toml", ".json")


def _module_file(parts: list[str], root: Path) -> Path | None:
    path = root.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(path: Path, name: str, member: bool = False) -> bool:
    """Whether `name` is defined in (or, at module level, imported into) the file `path`."""
    text = path.read_text()
    n = re.escape(name)
    if re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{n}\b|^\s*{n}\s*(?::[^=\n]*)?=|^\s*{n}\s*:", text, re.M):
        return True
    if member:
        return False
    imports = re.findall(r"^(?:from\s+\S+\s+)?import\s+(\([^)]*\)|.*)$", text, re.M)
    return any(re.search(rf"\b{n}\b", names) for names in imports)


def _module_names(root: Path) -> dict[str, list[list[str]]]:
    """{a module's own name: its dotted paths} for the project's packages (hyquant_jax.cli -> "cli")."""
    names: dict[str, list[list[str]]] = {}
    for pkg in PACKAGES + ("benchmarks",):
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            names.setdefault(parts[-1], []).append(parts)
    return names


def resolve_name(ref: str, root: Path = ROOT, modules: dict | None = None) -> bool | None:
    """True when `ref` (a.b.c) names a module of the tree or something defined in one, False when it starts with
    a module of the tree but names nothing there, None when it does not start with one (e.g. `jax.jit`)."""
    modules = _module_names(root) if modules is None else modules
    parts = ref.split(".")
    parts[0] = ALIASES.get(parts[0], parts[0])
    starts = ([parts] if parts[0] in PACKAGES + ("benchmarks",) else []) + [
        full + parts[1:] for full in modules.get(parts[0], [])]
    if not starts:
        return None
    for candidate in starts:
        for i in range(len(candidate), 0, -1):
            path = _module_file(candidate[:i], root)
            if path is not None:
                rest = candidate[i:]
                if not rest or (_defines(path, rest[0]) and all(_defines(path, m, member=True) for m in rest[1:])):
                    return True
                break
    return False


def cited_names(text: str) -> tuple[set[str], set[str]]:
    """(dotted names, file paths) in the backticked spans of `text`; a call's arguments are left off."""
    names, files = set(), set()
    for span in re.findall(r"`([^`\n]+)`", text):
        span = span.split("(")[0].strip()
        if FILE.fullmatch(span) and ("/" in span or span.endswith(FILE_SUFFIXES)):
            files.add(span)
        elif DOTTED.fullmatch(span):
            names.add(span)
    return names, files


def missing_file(path: str, root: Path = ROOT) -> bool:
    """Whether `path` (a tree path, a folder with a trailing /, or a bare file name such as decode.py) is absent;
    a name with `<...>` is a template and counts as present."""
    if "<" in path:
        return False
    if "/" not in path.rstrip("/"):
        return not any(p.is_file() or p.is_dir() for p in root.rglob(path.rstrip("/")) if ".venv" not in p.parts)
    return not any(root.glob(path.rstrip("/")))


def test_the_architecture_name_checks_catch_what_they_should():
    assert cited_names("`hq.load` `decode_launch.plan(...)` `jax.jit` `a b` `cache.py` `models/` "
                       "`tests/test_<file>.py`") == (
        {"hq.load", "decode_launch.plan", "jax.jit"}, {"cache.py", "models/", "tests/test_<file>.py"})
    for good in ("hq.load", "hyquant_jax.cache.HybridKVCache.ring_len", "decode_launch.DecodeTuning.low_bit",
                 "models.prefix_attention", "sharding.STATE_RULES", "cli.options.CONFIG_OPTIONS",
                 "attention.decode_step"):
        assert resolve_name(good) is True, good
    for bad in ("decode_launch.default_splits", "hq.no_such_name", "cache.HybridKVCache.no_such_field"):
        assert resolve_name(bad) is False, bad
    assert resolve_name("jax.jit") is None
    assert not missing_file("decode_launch.py") and not missing_file("hyquant_jax/cli/")
    assert missing_file("no_such_module.py") and missing_file("docs/no_such_file.md")


def test_architecture_names_exist():
    """Every module, function, class, constant and file that docs/architecture.md cites is in the tree."""
    names, files = cited_names(ARCHITECTURE.read_text())
    modules = _module_names(ROOT)
    checked = {n: resolve_name(n, ROOT, modules) for n in names}
    assert sum(r is True for r in checked.values()) >= 50, "too few project names found: is the pattern right?"
    missing = sorted(n for n, r in checked.items() if r is False) + sorted(f for f in files if missing_file(f))
    assert not missing, "docs/architecture.md cites names the tree lacks:\n" + "\n".join(missing)
