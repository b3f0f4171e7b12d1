"""The tracked tree speaks of the software only: no numbered work periods, issue numbers or period-numbered files.

History lives in git (docs/design.md says how to reach the archived experiments); a comment says why in the
present tense and points to a docs/design.md section where the reason is long.
"""

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
