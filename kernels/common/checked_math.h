// Overflow-checked int64 arithmetic for sizes, lengths, offsets and ids.
//
// Every sum, product and "+ 1" of values that come from a caller (tensor
// contents or attributes) goes through these helpers, so a wrapping value
// becomes an InvalidArgument naming the argument instead of a wrong offset, an
// out-of-bounds read or a TensorShape CHECK failure. TF-free: used by the
// *_impl layers, the OpKernels, the shape functions and the pybind11 module.
#ifndef HYBRIDTF_KERNELS_COMMON_CHECKED_MATH_H_
#define HYBRIDTF_KERNELS_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <limits>

namespace hybridtf {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// *out = a + b; false (and *out untouched) when the sum does not fit int64.
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// *out = a * b; false (and *out untouched) when the product does not fit int64.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// *out = a + 1; false when a is the largest int64.
inline bool CheckedInc(int64_t a, int64_t* out) { return CheckedAdd(a, 1, out); }

// a * b for non-negative a and b, clamped to the largest int64 (cost
// estimates, where saturation is harmless and an error would be wrong).
inline int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t r;
  return CheckedMul(a, b, &r) ? r : kInt64Max;
}

// a + b for non-negative a and b, clamped to the largest int64.
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  return CheckedAdd(a, b, &r) ? r : kInt64Max;
}

// True when a [rows, cols] buffer of `elem_bytes`-byte elements has a size
// that fits int64 bytes (rows, cols >= 0).
inline bool FitsBytes(int64_t rows, int64_t cols, int64_t elem_bytes) {
  int64_t n;
  return CheckedMul(rows, cols, &n) && CheckedMul(n, elem_bytes, &n);
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_CHECKED_MATH_H_
