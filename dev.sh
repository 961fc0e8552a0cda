#!/usr/bin/env bash
# One entry point for everything a developer or CI does. Each command first
# creates (or reuses) the virtual environment .venv with the pinned stack,
# Horovod built with Gloo, and hybridtf itself (op library + pybind11 module).
#
#   ./dev.sh demo    set up, then run the main demo
#   ./dev.sh test    set up, then lint and run the test suite (without the tests marked slow;
#                    ./dev.sh test --slow runs only those, --all everything; CI runs both)
#   ./dev.sh bench   set up, then run the benchmarks (JSON lines on stdout)
#   ./dev.sh lint    set up, then ruff + clang-format checks only
#   ./dev.sh setup   only set up
#
# Knobs: PYTHON (interpreter for the venv, default python3.11 or python3),
# HYBRIDTF_CUDA=auto|0|1 (build CUDA kernels when nvcc is found; default auto).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
VENV=$ROOT/.venv
PY=$VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}

log() { printf '\033[1m[dev.sh]\033[0m %s\n' "$*"; }

setup() {
  local t0=$SECONDS
  if [ ! -x "$PY" ]; then
    local base=${PYTHON:-$(command -v python3.11 || command -v python3)}
    log "creating .venv with $base"
    "$base" -m venv "$VENV"
  fi
  local stamp=$VENV/.hybridtf-deps
  local want
  want=$(cat requirements/stack.txt requirements/dev.txt requirements/test-nodeps.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing the pinned stack (requirements/stack.txt, requirements/dev.txt, requirements/test-nodeps.txt)"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q -r requirements/stack.txt -r requirements/dev.txt
    # Pure-Python test clients (DeepCTR) without their dependencies: they would pull another TensorFlow.
    "$PY" -m pip install -q --no-deps -r requirements/test-nodeps.txt
    echo "$want" > "$stamp"
  fi
  if ! "$PY" -c "import horovod.tensorflow as h, sys; sys.exit(0 if h.gloo_built() else 1)" >/dev/null 2>&1; then
    log "building horovod 0.28.1 with Gloo for TensorFlow (about 3 minutes)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
      HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= \
      "$PY" -m pip install -q --no-build-isolation --no-cache-dir horovod==0.28.1
  fi
  log "building hybridtf (op library + pybind11 module)"
  "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  log "set-up done in $((SECONDS - t0)) s"
}

lint() {
  log "ruff check / ruff format --check / clang-format"
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  git ls-files -co --exclude-standard -- 'kernels/*.h' 'kernels/*.cc' 'kernels/*.cu' \
    | xargs -r "$VENV/bin/clang-format" --dry-run -Werror
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$PY" examples/wdl_demo.py "$@" ;;
  lint) setup; lint ;;
  test)
    setup
    lint
    # The tiers: tests marked slow (their module's mark or tests/slow_tests.txt, tools/slow_tests.py)
    # are left out unless --slow (only them) or --all (everything) comes first.
    tier=(-m "not slow")
    case "${1:-}" in
      --slow) tier=(-m slow); shift ;;
      --all) tier=(); shift ;;
    esac
    log "pytest ${tier[*]:-(all tests)} (${HYBRIDTF_TEST_WORKERS:-2} workers; HYBRIDTF_TEST_WORKERS=0 runs in one process)"
    set +e
    workers=()
    if [ "${HYBRIDTF_TEST_WORKERS:-2}" != "0" ]; then workers=(-n "${HYBRIDTF_TEST_WORKERS:-2}" --dist loadgroup); fi
    # --durations: the slowest tests in every run's log (the suite's time budget is watched)
    "$PY" -m pytest -q -p no:cacheprovider --durations=25 "${workers[@]}" "${tier[@]}" "$@"
    rc=$?
    set -e
    # 5 = no tests collected: a test command that ran nothing has failed.
    exit $rc
    ;;
  bench)
    setup
    "$PY" benchmarks/bench_unique_partition.py --quick
    "$PY" benchmarks/bench_keras.py "$@"
    ;;
  *)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
