#!/usr/bin/env bash
# Builds hybridtf's op library with Bazel (CPU only) and optionally runs the op
# tests against it. The reference build is tools/build_ops.py; this one builds
# the same sources with the same flags (see BUILD.bazel, WORKSPACE).
#
#   tools/bazel_build.sh                  # -> build/bazel/_hybridtf_ops.so
#   tools/bazel_build.sh --test           # ... then pytest tests/ops against it
#   tools/bazel_build.sh --clean --test   # bazel clean --expunge first
#
# Environment:
#   HYBRIDTF_PYTHON  Python with TensorFlow (default: .venv/bin/python, else python3)
#   HYBRIDTF_JOBS    bazel --jobs (default: 2)
#
# Offline: nothing is downloaded (.bazelrc sets --experimental_repository_disable_download;
# WORKSPACE declares only local repositories). No JDK flags are needed: a C++-only
# build runs no Java actions, and Bazel's server uses the system JDK.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="$ROOT/build/bazel"
OUT="$OUT_DIR/_hybridtf_ops.so"
TARGET="//:_hybridtf_ops.so"

die() {
  echo "bazel_build.sh: error: $*" >&2
  exit 1
}

run_tests=0
clean=0
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    --clean) clean=1 ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
      exit 0
      ;;
    *) die "unknown argument '$arg' (use --test, --clean or --help)" ;;
  esac
done

command -v bazel >/dev/null 2>&1 ||
  die "bazel not found; install with apt-get install -y bazel-bootstrap"

if [[ -n "${HYBRIDTF_PYTHON:-}" ]]; then
  PYTHON="$HYBRIDTF_PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PYTHON="$ROOT/.venv/bin/python"
else
  PYTHON="$(command -v python3 || true)"
fi
[[ -n "$PYTHON" ]] || die "no Python found; set HYBRIDTF_PYTHON to a python with tensorflow installed"
[[ -x "$PYTHON" ]] || die "$PYTHON is not an executable Python (HYBRIDTF_PYTHON)"
# Absolute path: the repository rule runs it from another directory.
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"

# Identifies the installed TensorFlow without importing it (fast); when it
# changes (upgrade, reinstall), Bazel re-runs tf_configure for @local_tf.
TF_STAMP="$("$PYTHON" -c '
import importlib.util, os
spec = importlib.util.find_spec("tensorflow")
print("" if spec is None else "%s@%d" % (spec.origin, os.stat(spec.origin).st_mtime_ns))
')" || die "$PYTHON does not run"
[[ -n "$TF_STAMP" ]] || die "tensorflow is not installed for $PYTHON (set HYBRIDTF_PYTHON)"

cd "$ROOT"
BAZEL_FLAGS=(
  --jobs="${HYBRIDTF_JOBS:-2}"
  --repo_env=HYBRIDTF_PYTHON="$PYTHON"
  --repo_env=HYBRIDTF_TF_STAMP="$TF_STAMP"
)

if ((clean)); then
  echo "== bazel clean --expunge"
  bazel clean --expunge
fi

echo "== bazel build $TARGET (python: $PYTHON)"
start=$SECONDS
bazel build "${BAZEL_FLAGS[@]}" "$TARGET" || die "bazel build failed"
echo "== built in $((SECONDS - start)) s"

BIN="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin 2>/dev/null)" || die "bazel info bazel-bin failed"
mkdir -p "$OUT_DIR"
rm -f "$OUT"
cp "$BIN/_hybridtf_ops.so" "$OUT"
chmod u+w "$OUT"

record="$(grep -aoE 'HYBRIDTF_BUILD_INFO:\{[^}]*\}:END' "$OUT" || true)"
[[ -n "$record" ]] || die "$OUT has no HYBRIDTF_BUILD_INFO record"
echo "== $OUT"
echo "   $record"

if ((run_tests)); then
  echo "== pytest tests/ops with HYBRIDTF_OPS_LIBRARY=$OUT"
  HYBRIDTF_OPS_LIBRARY="$OUT" "$PYTHON" -m pytest tests/ops -q -p no:cacheprovider ||
    die "op tests failed against the Bazel-built library"
fi
echo "== done"
