#!/usr/bin/env bash
# torch_overlay build driver. `./build.sh help` lists the verbs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV_ROOT="${TORCH_OVERLAY_VENVS:-$HOME/.cache/torch_overlay/venvs}"
DEPS=(expecttest hypothesis pytest numpy safetensors)
# The interpreter that creates the private venvs.
BASE_PYTHON="${TORCH_OVERLAY_BASE_PYTHON:-python3}"

usage() {
  cat <<'USAGE'
Usage: ./build.sh VERB [ARGS]

  demo                 the status table, then the smallest reproducer of each fix this torch
                       needs, without and with the overlay (about a minute once torch is installed);
                       its last line counts them: "28/28 fixed (...)"
  test [PYTEST ARGS]   the linters (as `lint`), then the whole test suite (TORCH_VERSION=2.11.0 ./build.sh test
                       for another torch); with test paths in PYTEST ARGS, only those tests
                       TORCH_OVERLAY_TEST_LEG=light ./build.sh test: CI's light leg, what can differ
                       between torches (each fix's Quick-Test/Error-Test, the engine, status and explain,
                       one launcher job), in a few minutes; its summary says why the rest is skipped
                       TORCH_OVERLAY_TEST_JOBS=N ./build.sh test: N pytest processes share the run (each
                       takes the next test class or module; CI runs 2), outputs printed at the end
  lint                 ruff (lint and format check) and mypy, as configured in pyproject.toml, from a
                       private venv of pinned versions ($TORCH_OVERLAY_VENVS/lint; no torch needed)
  bench [--smoke]      import-time and fix benchmarks (--smoke: each runs tiny, in seconds: that they run)
  status [--json]      python -m torch_overlay status
  verify [IDS] [--quick] [-j N]
                       python -m torch_overlay verify: each fix's tests without and with the overlay
  apply PYTORCH_SRC [--check|--reverse]
                       apply the patch series to a PyTorch git checkout (checks all first)
  wheel [--out DIR] [WHEEL]
                       rebuild the installed torch's wheel (or WHEEL) with the series applied,
                       as version +overlay.N (default --out ./dist)
  stage PYTORCH_SRC [--branch NAME] [--out DIR]
                       one commit per patch with its upstream test and PR body, on a new branch
  (apply, wheel and stage take --patches DIR to use another series)
  matrix [--out FILE] [--ids ID,...] [--captured DIR] [VERSIONS]
                       verify --quick on each supported torch (2.11.0 2.12.1 2.13.0 2.14.1 2.15.0),
                       one after another in their private venvs; writes docs/measurements/matrix.md (or FILE) and fails
                       when a measured cell contradicts a patch's Affects/Introduced/Applied-Upstream
                       (--ids: verify only those fixes; the others read "not run"); also stores
                       what each reproducer raises without the overlay in patches/captured/<release>.json
                       (or DIR/<release>.json)
  compare TEST_FILE [--timeout S] [--no-reach] [-- PYTEST ARGS]
                       run a test file (e.g. PyTorch's own, fetched into a scratch folder) without
                       and with the overlay; list every test whose outcome differs (exit 1 if a
                       test that passes without the overlay fails with it), and each test's time
                       both ways, flagging a SLOWDOWN (over x1.2 and 5 s more with the overlay)
  conformance UPSTREAM_TESTS_DIR [--files F,...] [--timeout S]
                       run the upstream test files of the conformance record found in UPSTREAM_TESTS_DIR
                       (a PyTorch checkout's test/) through compare, without and with the overlay, on the
                       oldest and newest torch of their fixes; writes docs/measurements/conformance.toml
                       and .md (hours for the whole record on 2 cores: not part of CI)
  python               print the path of the Python interpreter used for TORCH_VERSION
  help                 this text

Environment: TORCH_VERSION (default 2.13.0) picks the torch. Each version lives in a private venv,
~/.cache/torch_overlay/venvs/<version> (TORCH_OVERLAY_VENVS), created on first use with exactly that
torch; nothing is installed into your own Python. PYTHON=/path/to/python uses that interpreter
instead, if its torch is TORCH_VERSION.
USAGE
}

# The torch version (without a local label such as +cpu) of interpreter $1, read without importing
# torch; empty when it has no complete torch install (pip writes the dist-info last).
torch_version_of() {
  [ -x "$(command -v "$1" 2>/dev/null)" ] || return 0
  "$1" - <<'PY' 2>/dev/null || true
import importlib.metadata, importlib.util
if importlib.util.find_spec("torch"):
    print(importlib.metadata.version("torch").split("+")[0])
PY
}

# Print the interpreter for TORCH_VERSION: $PYTHON if its torch is that version, else the private
# venv $VENV_ROOT/<version>, created (or rebuilt, if an install failed half way) on first use.
# Nothing is installed into any other interpreter.
python_for_version() {
  local v="$TORCH_VERSION" py found
  if [ -n "${PYTHON:-}" ]; then
    found="$(torch_version_of "$PYTHON")"
    if [ "$found" != "$v" ]; then
      echo "error: PYTHON=$PYTHON has torch ${found:-(none)}, not $v: set TORCH_VERSION=${found:-...}, or unset PYTHON to use the private venv $VENV_ROOT/$v" >&2
      exit 2
    fi
    ensure_deps "$PYTHON" "PYTHON=$PYTHON"
    command -v "$PYTHON"
    return
  fi
  py="$VENV_ROOT/$v/bin/python"
  if [ "$(torch_version_of "$py")" != "$v" ]; then
    create_venv "$v"
  fi
  ensure_deps "$py" "the private venv $VENV_ROOT/$v"
  echo "$py"
}

create_venv() {
  local v="$1" dir="$VENV_ROOT/$1"
  if [ -e "$dir" ]; then
    echo "== $dir has no torch $v (an earlier install failed or was interrupted): rebuilding it" >&2
  fi
  echo "== installing torch==$v and the test tools (${DEPS[*]}) into a private venv, $dir," >&2
  echo "   because build.sh does not install into your own Python (PYTHON=/path/to/python uses one that has torch $v)" >&2
  "$BASE_PYTHON" -m venv --clear "$dir" >&2
  # Pinned exactly: this venv exists for torch $v, so a machine-wide pip constraint (pip.conf's
  # global.constraint, PIP_CONSTRAINT) capping torch must not veto it.
  if ! PIP_CONSTRAINT=/dev/null "$dir/bin/python" -m pip install -q "torch==$v" "${DEPS[@]}" >&2; then
    echo "error: pip could not install torch==$v into $dir (pip's error is above); the next run rebuilds it" >&2
    exit 1
  fi
  local got
  got="$(torch_version_of "$dir/bin/python")"
  if [ "$got" != "$v" ]; then
    echo "error: pip installed torch ${got:-(none)} into $dir, not $v" >&2
    exit 1
  fi
}

# Install the missing test tools into interpreter $1 (described by $2).
ensure_deps() {
  "$1" -c "import expecttest, hypothesis, pytest, numpy, safetensors" >/dev/null 2>&1 && return
  echo "== installing the test tools (${DEPS[*]}) into $2: the tests need them" >&2
  "$1" -m pip install -q "${DEPS[@]}" >&2
}

# The trainers whose recipes the suite runs (tests/recipes/), installed where the whole suite runs.
CLIENTS=(transformers==5.23.0 accelerate==1.15.0)

# Install the recipes' trainers into interpreter $1 (torch $2), keeping its torch: pinned by a
# constraint, since a plain install under a machine-wide pip cap would swap torch for another release.
ensure_clients() {
  "$1" -c "import transformers, accelerate" >/dev/null 2>&1 && return
  local pin
  pin="$(mktemp)"
  echo "torch==$2" >"$pin"
  echo "== installing ${CLIENTS[*]} into $1 for the recipes' tests (torch pinned to $2)" >&2
  PIP_CONSTRAINT=/dev/null "$1" -m pip install -q -c "$pin" "${CLIENTS[@]}" >&2 || {
    rm -f "$pin"
    echo "error: pip could not install ${CLIENTS[*]} (pip's error is above)" >&2
    return 1
  }
  rm -f "$pin"
  [ "$(torch_version_of "$1")" = "$2" ] || { echo "error: installing ${CLIENTS[*]} changed torch in $1" >&2; return 1; }
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

LINTERS=(ruff==0.17.5 mypy==2.4.1)

cmd_lint() {
  local dir="$VENV_ROOT/lint" rc=0
  if ! "$dir/bin/python" -m pip freeze 2>/dev/null | grep -qx "${LINTERS[0]}" ||
    ! "$dir/bin/python" -m pip freeze 2>/dev/null | grep -qx "${LINTERS[1]}"; then
    echo "== installing ${LINTERS[*]} into a private venv, $dir" >&2
    "$BASE_PYTHON" -m venv --clear "$dir" >&2
    "$dir/bin/python" -m pip install -q "${LINTERS[@]}" >&2
  fi
  cd "$ROOT"
  echo "== ruff check, ruff format --check, mypy (pyproject.toml)"
  "$dir/bin/ruff" check torch_overlay tests benchmarks || rc=1
  "$dir/bin/ruff" format --check torch_overlay tests benchmarks || rc=1
  "$dir/bin/mypy" || rc=1
  [ $rc -eq 0 ] || echo "error: the linters failed (\`./build.sh lint\`; \`ruff check --fix\` and \`ruff format\` fix most)" >&2
  return $rc
}

cmd_test() {
  local py
  py="$(python_for_version)"
  # The whole suite starts with the linters, so that CI fails on them too.
  if ! test_paths_given "$@"; then
    cmd_lint || return 1
    # The light leg runs no recipe; the whole suite does.
    [ "${TORCH_OVERLAY_TEST_LEG:-}" = light ] || ensure_clients "$py" "$TORCH_VERSION" || return 1
  fi
  echo "== torch_overlay test suite on torch $TORCH_VERSION ($py)"
  cd "$ROOT"
  local jobs="${TORCH_OVERLAY_TEST_JOBS:-1}"
  [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "error: TORCH_OVERLAY_TEST_JOBS=$jobs is not a number of processes" >&2; return 2; }
  local paths
  paths="$(test_paths_given "$@" || echo tests)"
  local pytest=("$py" -m pytest -q -p no:cacheprovider -o addopts="" --durations=15 $paths "$@")
  [ "$jobs" -gt 1 ] && { run_test_jobs "$jobs" "${pytest[@]}"; return; }
  local cache rc=0
  cache="$(mktemp -d)"
  # A private inductor cache: a graph cached by another run must not hide a bug or a fix.
  TORCHINDUCTOR_CACHE_DIR="$cache" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "${pytest[@]}" || rc=$?
  rm -rf "$cache"
  return $rc
}

# JOBS PYTEST_COMMAND...: one suite run by JOBS such pytest processes at once, each taking the next
# unclaimed test class or module (tests/_shards.py), each with its own inductor cache; their
# outputs are printed one after the other when all have ended, and any failure fails the run.
run_test_jobs() {
  local jobs="$1" work rc=0 i
  shift
  work="$(mktemp -d)"
  mkdir "$work/claims"
  echo "   in $jobs pytest processes at once (TORCH_OVERLAY_TEST_JOBS=$jobs); each prints its tests when all have ended"
  local pids=()
  for ((i = 1; i <= jobs; i++)); do
    mkdir "$work/inductor-$i"
    TORCH_OVERLAY_TEST_CLAIMS="$work/claims" TORCHINDUCTOR_CACHE_DIR="$work/inductor-$i" \
      PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$@" >"$work/out-$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 1; i <= jobs; i++)); do
    wait "${pids[$((i - 1))]}" || rc=1
  done
  for ((i = 1; i <= jobs; i++)); do
    echo "== pytest process $i of $jobs"
    cat "$work/out-$i"
  done
  rm -rf "$work"
  [ $rc -eq 0 ] || echo "error: a pytest process of the suite failed (its output is above)" >&2
  return $rc
}

cmd_demo() {
  local py
  py="$(python_for_version)"
  echo "== python -m torch_overlay status (torch $TORCH_VERSION, $py)"
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m torch_overlay status
  echo
  echo "== python -m torch_overlay verify --quick --needed: the smallest reproducer of each fix this torch"
  echo "   needs, without and with the overlay (all of them in one pytest process each way, side by side)"
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m torch_overlay verify --quick --needed --budget "${DEMO_BUDGET_S:-45}" "$@"
}

SUPPORTED_VERSIONS=(2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)

cmd_matrix() {
  local out="$ROOT/docs/measurements/matrix.md" captured="$ROOT/patches/captured"
  local ids=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --out)
        out="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
        shift 2
        ;;
      --ids)
        IFS=, read -ra ids <<<"$2"
        shift 2
        ;;
      --captured)
        captured="$(mkdir -p "$2" && cd "$2" && pwd)"
        shift 2
        ;;
      *) break ;;
    esac
  done
  local versions=("$@") reports v py rc=0 capture_ids=()
  [ ${#ids[@]} -gt 0 ] && capture_ids=(--ids "$(IFS=,; echo "${ids[*]}")")
  [ ${#versions[@]} -gt 0 ] || versions=("${SUPPORTED_VERSIONS[@]}")
  reports="$(mktemp -d)"
  for v in "${versions[@]}"; do
    echo "== torch $v: status, then verify --quick --needed (progress below)" >&2
    py="$(TORCH_VERSION="$v" python_for_version)"
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m torch_overlay status --json >"$reports/$v.status.json" || true
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m torch_overlay verify --quick --needed --json \
      ${ids[@]+"${ids[@]}"} >"$reports/$v.verify.json" || true
    echo "== torch $v: what each reproducer raises without the overlay (patches/captured/)" >&2
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m torch_overlay.tools capture \
      --out "$captured/$v.json" ${capture_ids[@]+"${capture_ids[@]}"} >&2 || rc=1
  done
  run_py -m torch_overlay.tools matrix "$reports"/*.json --out "$out" || rc=$?
  rm -rf "$reports"
  return $rc
}

cmd_bench() {
  local b rc=0
  for b in "$ROOT"/benchmarks/bench_*.py; do
    echo "== ${b#"$ROOT"/} $*"
    run_py "$b" "$@" || { echo "error: ${b#"$ROOT"/} failed" >&2; rc=1; }
  done
  return $rc
}

verb="${1:-help}"
[ $# -gt 0 ] && shift
case "$verb" in
  demo) cmd_demo "$@" ;;
  test) cmd_test "$@" ;;
  bench) cmd_bench "$@" ;;
  lint) cmd_lint ;;
  matrix) cmd_matrix "$@" ;;
  status) run_py -m torch_overlay status "$@" ;;
  verify) run_py -m torch_overlay verify "$@" ;;
  apply | wheel | stage | compare) run_py -m torch_overlay.tools "$verb" "$@" ;;
  conformance)
    [ $# -gt 0 ] || { echo "usage: ./build.sh conformance UPSTREAM_TESTS_DIR [--files F,...] [--timeout S]" >&2; exit 2; }
    dir="$1"
    shift
    run_py -m torch_overlay.tools conformance --run "$dir" "$@"
    ;;
  python) python_for_version ;;
  help | -h | --help) usage ;;
  *)
    echo "unknown verb: $verb" >&2
    usage >&2
    exit 2
    ;;
esac
