#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of hybridtf's TF-free layer.
#
# Builds the pybind11 module (kernels/python/*.cc + the *_impl.cc it binds, the list in
# tools/native_sources.py) with -fsanitize=address,undefined -fno-sanitize-recover=undefined into
# build/sanitize/, then, with the ASan runtime preloaded and HYBRIDTF_NATIVE_MODULE pointing
# hybridtf.native at that build, runs
#   1. the NumPy-binding tests (tests/ops/test_native_bindings.py, no TensorFlow in the process);
#   2. a fuzz slice of every op the module binds (tools/fuzz_ops.py --paths native), in worker
#      processes: a sanitizer report aborts its worker, which the fuzzer counts as a crash.
# Any report fails the script; the reports are kept in build/sanitize/reports/.
#
# Usage: tools/sanitize.sh [--cases N]   (default 400 fuzz cases per op; about 2 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
CXX=${CXX:-g++}
CASES=400
if [ "${1:-}" = "--cases" ]; then CASES=$2; fi
OUT=build/sanitize
REPORTS=$OUT/reports
rm -rf "$REPORTS"
mkdir -p "$OUT" "$REPORTS"

SUFFIX=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
MODULE=$OUT/_native$SUFFIX
SOURCES=$("$PY" tools/native_sources.py)
FLAGS="-std=c++17 -O1 -g -fno-omit-frame-pointer -fPIC -shared -fvisibility=hidden -fsanitize=address,undefined -fno-sanitize-recover=undefined"
INCLUDES="-I. $("$PY" -m pybind11 --includes)"
echo "[sanitize] building $MODULE"
mkdir -p "$OUT/obj"
OBJS=""
for src in $SOURCES; do OBJS="$OBJS $OUT/obj/$(echo "$src" | tr / _).o"; done
# One compiler per source, in parallel, for the sources (or headers) newer than their object.
NEWEST_HEADER=$(find kernels -name '*.h' -newer "$OUT/obj" -print -quit 2>/dev/null || true)
STALE=""
for src in $SOURCES; do
  obj=$OUT/obj/$(echo "$src" | tr / _).o
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$NEWEST_HEADER" ]; then STALE="$STALE $src"; fi
done
if [ -n "$STALE" ]; then
  # shellcheck disable=SC2086
  printf '%s\n' $STALE | xargs -P "$(nproc)" -I{} sh -c \
    "$CXX $FLAGS -c $INCLUDES {} -o $OUT/obj/\$(echo {} | tr / _).o"
fi
touch "$OUT/obj"
# shellcheck disable=SC2086
"$CXX" $FLAGS $OBJS -o "$MODULE"

# The ASan runtime first; libstdc++ too, so that ASan can intercept __cxa_throw (the bindings
# throw pybind11 exceptions for bad input) although python itself does not link libstdc++.
export LD_PRELOAD
LD_PRELOAD="$("$CXX" -print-file-name=libasan.so) $("$CXX" -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$PWD/$REPORTS/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$REPORTS/ubsan"
export HYBRIDTF_NATIVE_MODULE=$PWD/$MODULE HYBRIDTF_FUZZ_NATIVE_ONLY=1 PYTHONPATH=$PWD

echo "[sanitize] NumPy-binding tests"
"$PY" -m pytest -q -p no:cacheprovider tests/ops/test_native_bindings.py
echo "[sanitize] fuzz slice through the bindings ($CASES cases per op)"
"$PY" tools/fuzz_ops.py --paths native --cases "$CASES" --seed 11 --jobs 2 --timeout 60 \
  --repro-dir "$OUT/repro" --json "$OUT/fuzz.json"

if compgen -G "$REPORTS/*" >/dev/null; then
  echo "[sanitize] sanitizer reports:" >&2
  cat "$REPORTS"/* >&2
  exit 1
fi
echo "[sanitize] clean: no ASan/UBSan report"
