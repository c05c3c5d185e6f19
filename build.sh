#!/usr/bin/env bash
# torch_overlay build driver. `./build.sh help` lists the verbs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV_ROOT="${TORCH_OVERLAY_VENVS:-$HOME/.cache/torch_overlay/venvs}"
DEPS=(expecttest hypothesis pytest numpy)

usage() {
  cat <<'USAGE'
Usage: ./build.sh VERB [ARGS]

  demo                 install what is needed, show the status table and each fix's reproducer
                       without and with the overlay
  test [PYTEST ARGS]   run the whole test suite (TORCH_VERSION=2.11.0 ./build.sh test for another torch)
  bench                import-time and fix benchmarks
  status [--json]      python -m torch_overlay status
  verify [IDS]         python -m torch_overlay verify
  apply PYTORCH_SRC [--check|--reverse]
                       apply the patch series to a PyTorch git checkout (checks all first)
  wheel [--out DIR] [WHEEL]
                       rebuild the installed torch's wheel (or WHEEL) with the series applied,
                       as version +overlay.N (default --out ./dist)
  stage PYTORCH_SRC [--branch NAME] [--out DIR]
                       one commit per patch with its upstream test and PR body, on a new branch
  (apply, wheel and stage take --patches DIR to use another series)
  python               print the path of the Python interpreter used for TORCH_VERSION
  help                 this text

Environment: TORCH_VERSION (default 2.13.0) picks the torch; versions other than the machine's
default live in venvs under ~/.cache/torch_overlay/venvs/<version> (TORCH_OVERLAY_VENVS), created
on first use.
USAGE
}

# Print the interpreter for TORCH_VERSION, installing torch and the test deps if needed.
python_for_version() {
  local v="$TORCH_VERSION" py
  for py in "${PYTHON:-}" python3; do
    [ -n "$py" ] || continue
    if command -v "$py" >/dev/null 2>&1 && [ "$("$py" - <<'PY' 2>/dev/null
import importlib.util, re, pathlib
spec = importlib.util.find_spec("torch")
if spec:
    text = (pathlib.Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    print(re.search(r"__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"+]+)", text).group(1))
PY
)" = "$v" ]; then
      ensure_deps "$py"
      command -v "$py"
      return
    fi
  done
  if [ "$v" = "2.13.0" ] && [ -z "${TORCH_OVERLAY_FORCE_VENV:-}" ]; then
    # The machine keeps a 2.13.0 CPU wheel: a plain install takes it in seconds.
    echo "installing torch==$v into $(command -v python3)" >&2
    python3 -m pip install -q "torch==$v" "${DEPS[@]}" >&2
    command -v python3
    return
  fi
  py="$VENV_ROOT/$v/bin/python"
  if [ ! -x "$py" ] || ! "$py" -c "import torch" >/dev/null 2>&1; then
    echo "creating $VENV_ROOT/$v with torch==$v (a few minutes, ~4.6 GB)" >&2
    python3 -m venv "$VENV_ROOT/$v" >&2
    "$py" -m pip install -q "torch==$v" "${DEPS[@]}" >&2
  fi
  ensure_deps "$py"
  echo "$py"
}

ensure_deps() {
  "$1" -c "import expecttest, hypothesis, pytest, numpy" >/dev/null 2>&1 ||
    "$1" -m pip install -q "${DEPS[@]}" >&2
}

run_py() {
  local py
  py="$(python_for_version)"
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" "$@"
}

# Succeeds when the arguments name test files or folders (then `tests` is not added).
test_paths_given() {
  local a
  for a in "$@"; do
    [[ "$a" != -* && -e "$ROOT/${a%%::*}" ]] && return 0
  done
  return 1
}

cmd_test() {
  local py
  py="$(python_for_version)"
  echo "== torch_overlay test suite on torch $TORCH_VERSION ($py)"
  cd "$ROOT"
  local cache rc=0
  cache="$(mktemp -d)"
  # A private inductor cache: a graph cached by another run must not hide a bug or a fix.
  TORCHINDUCTOR_CACHE_DIR="$cache" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -p no:cacheprovider -o addopts="" $(test_paths_given "$@" || echo tests) "$@" || rc=$?
  rm -rf "$cache"
  return $rc
}

cmd_demo() {
  echo "== python -m torch_overlay status (torch $TORCH_VERSION)"
  run_py -m torch_overlay status
  echo
  echo "== python -m torch_overlay verify: each fix's reproducer without and with the overlay"
  run_py -m torch_overlay verify
}

cmd_bench() {
  local b
  for b in "$ROOT"/benchmarks/bench_*.py; do
    run_py "$b"
  done
}

verb="${1:-help}"
[ $# -gt 0 ] && shift
case "$verb" in
  demo) cmd_demo "$@" ;;
  test) cmd_test "$@" ;;
  bench) cmd_bench "$@" ;;
  status) run_py -m torch_overlay status "$@" ;;
  verify) run_py -m torch_overlay verify "$@" ;;
  apply | wheel | stage) run_py -m torch_overlay.tools "$verb" "$@" ;;
  python) python_for_version ;;
  help | -h | --help) usage ;;
  *)
    echo "unknown verb: $verb" >&2
    usage >&2
    exit 2
    ;;
esac
