#!/usr/bin/env bash
# Builds the standalone (TensorFlow-free) CUDA test harnesses with nvcc alone and,
# when a GPU is present (or with --run), runs them. Without a GPU a harness runs the
# kernels' per-index bodies on the host against the CPU layer (what CI does with
# --run on its GPU-less machine). With --compile-only it only builds. With --sanitize it runs each
# harness under compute-sanitizer's memcheck, racecheck, initcheck and synccheck
# (batch sizes capped at HYBRIDTF_HARNESS_MAX_IDS, default 65537: the tools are slow).
# With --time it runs them and then times the GPU layers against the CPU layers
# (lines starting "TIME").
#
#   tools/cuda_harness.sh [--compile-only|--run|--sanitize|--time] [--archs "80;90"]
set -euo pipefail
cd "$(dirname "$0")/.."
mode=auto
archs="${HYBRIDTF_CUDA_ARCHS:-80;90}"
while [ $# -gt 0 ]; do
  case "$1" in
    --compile-only) mode=compile ;;
    --run) mode=run ;;
    --sanitize) mode=sanitize ;;
    --time) mode=time ;;
    --archs) archs="$2"; shift ;;
    *) echo "usage: $0 [--compile-only|--run|--sanitize|--time] [--archs \"80;90\"]" >&2; exit 2 ;;
  esac
  shift
done
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$nvcc" ] || { echo "nvcc not found: install the CUDA toolkit" >&2; exit 1; }
gencode=()
IFS=';' read -ra list <<< "$archs"
for a in "${list[@]}"; do gencode+=("-gencode=arch=compute_${a},code=sm_${a}"); done
mkdir -p build/cuda
for test in kernels/*/*_impl_test.cu; do
  family=$(basename "$(dirname "$test")")
  out="build/cuda/${family}_impl_test"
  impl_cc=(kernels/"$family"/*_impl.cc)
  impl_cu=(kernels/"$family"/*_impl.cu)
  echo "nvcc: $test -> $out"
  "$nvcc" -std=c++17 -O2 "${gencode[@]}" -I. -o "$out" "$test" "${impl_cu[@]}" "${impl_cc[@]}"
  if [ "$mode" = run ] || { [ "$mode" = auto ] && nvidia-smi -L >/dev/null 2>&1; }; then
    "$out"
  elif [ "$mode" = time ]; then
    "$out" --time
  elif [ "$mode" = sanitize ]; then
    sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
    for tool in memcheck racecheck initcheck synccheck; do
      echo "compute-sanitizer --tool $tool: $out"
      HYBRIDTF_HARNESS_MAX_IDS="${HYBRIDTF_HARNESS_MAX_IDS:-65537}" \
        "$sanitizer" --tool "$tool" --error-exitcode 9 "$out"
    done
  fi
done
