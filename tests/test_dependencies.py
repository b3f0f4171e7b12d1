"""pyproject.toml's dependencies match the code's imports.

Every runtime dependency is imported by the package code (hyquant_jax, models, pallas_kernels), every optional
extra's package somewhere in the package, benchmark or test code, and every third-party module those import is
declared; the package imports its extras' modules only inside functions, so `import hyquant_jax` needs the
runtime dependencies alone.
"""

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hyquant_jax", "models", "pallas_kernels")
FIRST_PARTY = PACKAGES + ("benchmarks", "tests")
# distribution name -> the module its users import, where the two differ
IMPORT_NAMES = {"jaxlib": "jax"}  # jaxlib is jax's compiled backend; code imports jax
# third-party modules imported without being declared: where they may be imported, and why
UNDECLARED = {
    "ml_dtypes": ("tests/", "installed with jax (one of its dependencies); the tests make bf16 and fp8 arrays"),
    "torch": ("tests/fixtures/", "the scripts that regenerate the fixtures, not run by the tests"),
    "transformers": ("tests/fixtures/", "the scripts that regenerate the fixtures, not run by the tests"),
}


# declared packages that are command-line tools, not imported: why they are declared
TOOLS = {"ruff": "the linter the README's test command runs (`ruff check .`)"}


def _import_name(requirement: str) -> str:
    dist = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0).lower().replace("-", "_").replace(".", "_")
    return IMPORT_NAMES.get(dist, dist)


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(import names of the runtime dependencies, {extra: import names of its packages})."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_import_name(r) for r in project["dependencies"]}
    extras = {name: {_import_name(r) for r in reqs} for name, reqs in project.get("optional-dependencies", {}).items()}
    return runtime, extras


def third_party_imports() -> list[tuple[str, str, bool]]:
    """(top-level module, file relative to the root, imported at module level) for every third-party import."""
    found = []
    for folder in FIRST_PARTY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node) for node in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in FIRST_PARTY and top != "__future__":
                        found.append((top, str(path.relative_to(ROOT)), id(node) in top_level))
    return found


@pytest.fixture(scope="module")
def imports():
    return third_party_imports()


def _in_package(path: str) -> bool:
    return path.split("/")[0] in PACKAGES


def test_the_parser_reads_requirement_names():
    assert [_import_name(r) for r in ("jax==0.11.2", "jaxlib==0.11.2", "flax>=0.12", "ml-dtypes", "Jinja2>=3.1",
                                      "tqdm")] == ["jax", "jax", "flax", "ml_dtypes", "jinja2", "tqdm"]


def test_every_runtime_dependency_is_imported_by_the_package(imports):
    runtime, _ = declared()
    used = {module for module, path, _ in imports if _in_package(path)}
    assert runtime <= used, f"runtime dependencies the package never imports: {sorted(runtime - used)}"


def test_every_extra_is_imported(imports):
    _, extras = declared()
    used = {module for module, _, _ in imports}
    unused = {name: sorted(mods - used - set(TOOLS)) for name, mods in extras.items() if mods - used - set(TOOLS)}
    assert not unused, f"optional dependencies imported nowhere: {unused}"


def test_every_third_party_import_is_declared(imports):
    runtime, extras = declared()
    known = runtime.union(*extras.values())
    missing = sorted({f"{module} ({path})" for module, path, _ in imports
                      if module not in known and not path.startswith(UNDECLARED.get(module, ("//",))[0])})
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_the_package_imports_its_extras_inside_functions(imports):
    """A module-level import of an extra's package would make `import hyquant_jax` fail without that extra."""
    runtime, _ = declared()
    eager = sorted({f"{module} ({path})" for module, path, top in imports
                    if _in_package(path) and top and module not in runtime})
    assert not eager, f"module-level imports of optional packages in the package code: {eager}"
