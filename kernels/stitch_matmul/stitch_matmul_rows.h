// Row kernels of the StitchConcatMatMul CPU layer (stitch_matmul_impl.cc):
// a row (or four rows) times a kernel block, and row sums/axpys, with the
// width known at compile time for the common widths. Internal to the
// stitch_matmul family.
#ifndef HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_ROWS_H_
#define HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_ROWS_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace hybridtf {
namespace stitch_combine {
namespace matmul_rows {

// The row helpers are always inlined so that they are compiled inside each
// HYBRIDTF_MULTIVERSION clone of their callers (a call would run baseline code).
#define HYBRIDTF_ROW_INLINE inline __attribute__((always_inline))
// The same for lambdas inside those helpers (otherwise compiled for the baseline target).
#define HYBRIDTF_LAMBDA_INLINE __attribute__((always_inline))

// Eight floats, loadable from any float address (GCC vector extension: one
// 256-bit register in the AVX2 clone, two 128-bit ones in the baseline build).
typedef float Float8 __attribute__((vector_size(32), aligned(4)));

// acc[0:n] (+)= e[0:dim] @ k for a long float row (n > 64, k's rows n apart):
// the columns in blocks of 64, then of 8, each block's accumulator in vector
// registers while e's values are broadcast (the generic loop would keep the
// accumulator in memory: a load and a store per multiply-add); the last n % 8
// columns one by one. Per column the products are summed over c in order,
// then added to acc's old value when Add.
template <bool Add>
HYBRIDTF_ROW_INLINE void ProjectWide(const float* __restrict e, int64_t dim,
                                     const float* __restrict k, int64_t n, float* __restrict acc) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    Float8 a[8] = {};
    for (int64_t c = 0; c < dim; ++c) {
      const float x = e[c];
      const Float8 xb = {x, x, x, x, x, x, x, x};
      const Float8* kc = reinterpret_cast<const Float8*>(k + c * n + j);
      for (int v = 0; v < 8; ++v) a[v] += xb * kc[v];
    }
    Float8* out = reinterpret_cast<Float8*>(acc + j);
    for (int v = 0; v < 8; ++v) out[v] = Add ? out[v] + a[v] : a[v];
  }
  for (; j + 8 <= n; j += 8) {
    Float8 a = {};
    for (int64_t c = 0; c < dim; ++c) {
      const float x = e[c];
      const Float8 xb = {x, x, x, x, x, x, x, x};
      a += xb * *reinterpret_cast<const Float8*>(k + c * n + j);
    }
    Float8* out = reinterpret_cast<Float8*>(acc + j);
    *out = Add ? *out + a : a;
  }
  for (; j < n; ++j) {
    float a = 0.0f;
    for (int64_t c = 0; c < dim; ++c) a += e[c] * k[c * n + j];
    acc[j] = Add ? acc[j] + a : a;
  }
}

// acc[0:n] += e[0:dim] @ k, k being dim rows of n values (U == n when U > 0);
// with Add == false, acc[0:n] = e[0:dim] @ k (acc's old values are not read).
// For float rows of a compile-time width that is a multiple of 8 the
// accumulator lives in vector registers and each e[c] is broadcast: written
// out with vector types because GCC's auto-vectorizer otherwise vectorizes
// the outer loop (with shuffles). Same operations in the same order either way.
template <int U, typename T, bool Add = true>
HYBRIDTF_ROW_INLINE void ProjectAdd(const T* __restrict e, int64_t dim, const T* __restrict k,
                                    int64_t n, T* __restrict acc) {
  if constexpr (U > 0 && U % 8 == 0 && U <= 64 && std::is_same<T, float>::value) {
    // kChains independent accumulators per vector (c interleaved) so that
    // eight vector additions are in flight (two adders of latency three or
    // four); summed in a fixed order at the end.
    constexpr int kVecs = U / 8;
    constexpr int kChains = kVecs >= 8 ? 1 : 8 / kVecs;
    Float8 a[kChains][kVecs] = {};
    int64_t c = 0;
    for (; c + kChains <= dim; c += kChains) {
      for (int h = 0; h < kChains; ++h) {
        const float x = e[c + h];
        const Float8 xb = {x, x, x, x, x, x, x, x};
        const Float8* kc = reinterpret_cast<const Float8*>(k + (c + h) * U);
        for (int v = 0; v < kVecs; ++v) a[h][v] += xb * kc[v];
      }
    }
    for (; c < dim; ++c) {
      const float x = e[c];
      const Float8 xb = {x, x, x, x, x, x, x, x};
      const Float8* kc = reinterpret_cast<const Float8*>(k + c * U);
      for (int v = 0; v < kVecs; ++v) a[0][v] += xb * kc[v];
    }
    for (int v = 0; v < kVecs; ++v) {
      Float8 total = a[0][v];
      if constexpr (Add) total = *reinterpret_cast<const Float8*>(acc + 8 * v) + a[0][v];
      for (int h = 1; h < kChains; ++h) total += a[h][v];
      *reinterpret_cast<Float8*>(acc + 8 * v) = total;
    }
  } else if constexpr (U > 0) {
    T a[U];
    for (int j = 0; j < U; ++j) a[j] = Add ? acc[j] : T(0);
    for (int64_t c = 0; c < dim; ++c) {
      const T x = e[c];
      const T* kc = k + c * U;
      for (int j = 0; j < U; ++j) a[j] += x * kc[j];
    }
    for (int j = 0; j < U; ++j) acc[j] = a[j];
  } else {
    if constexpr (std::is_same<T, float>::value) {
      if (n > 64) return ProjectWide<Add>(e, dim, k, n, acc);
    }
    if (!Add) std::fill(acc, acc + n, T(0));
    for (int64_t c = 0; c < dim; ++c) {
      const T x = e[c];
      const T* kc = k + c * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += x * kc[j];
    }
  }
}

// d[r][0:D] += s[r][0:n] @ kt for four rows r, kt being n rows of D floats
// (D = 8 or 16): each kt row is loaded once for the four rows, and the four
// rows' accumulators (two interleaved ones per row when D = 8) keep eight
// vector additions in flight. Summed in a fixed order.
template <int D>
HYBRIDTF_ROW_INLINE void ProjectRows4(const float* const* s, int64_t n, const float* __restrict kt,
                                      float* const* d) {
  static_assert(D == 8 || D == 16, "ProjectRows4 takes rows of 8 or 16 floats");
  constexpr int kVecs = D / 8;
  constexpr int kChains = kVecs == 1 ? 2 : 1;
  Float8 a[4][kChains][kVecs] = {};
  int64_t j = 0;
  for (; j + kChains <= n; j += kChains) {
    for (int h = 0; h < kChains; ++h) {
      const Float8* kj = reinterpret_cast<const Float8*>(kt + (j + h) * D);
      Float8 kv[kVecs];
      for (int v = 0; v < kVecs; ++v) kv[v] = kj[v];
      for (int r = 0; r < 4; ++r) {
        const float x = s[r][j + h];
        const Float8 xb = {x, x, x, x, x, x, x, x};
        for (int v = 0; v < kVecs; ++v) a[r][h][v] += xb * kv[v];
      }
    }
  }
  for (; j < n; ++j) {
    const Float8* kj = reinterpret_cast<const Float8*>(kt + j * D);
    for (int r = 0; r < 4; ++r) {
      const float x = s[r][j];
      const Float8 xb = {x, x, x, x, x, x, x, x};
      for (int v = 0; v < kVecs; ++v) a[r][0][v] += xb * kj[v];
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      Float8 total = a[r][0][v];
      for (int h = 1; h < kChains; ++h) total += a[r][h][v];
      Float8* out = reinterpret_cast<Float8*>(d[r] + 8 * v);
      *out = *out + total;
    }
  }
}

// acc[0:n] += src[0:n].
template <int U, typename T>
HYBRIDTF_ROW_INLINE void AddRow(T* __restrict acc, const T* __restrict src, int64_t n) {
  const int64_t m = U > 0 ? U : n;
  for (int64_t j = 0; j < m; ++j) acc[j] += src[j];
}

// acc[0:n] += (x0 * s0 + x1 * s1) + (x2 * s2 + x3 * s3), elementwise.
template <typename T>
HYBRIDTF_ROW_INLINE void AxpyRows4(T* __restrict acc, T x0, T x1, T x2, T x3,
                                   const T* __restrict s0, const T* __restrict s1,
                                   const T* __restrict s2, const T* __restrict s3, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += (x0 * s0[j] + x1 * s1[j]) + (x2 * s2[j] + x3 * s3[j]);
}

// acc[0:n] += x * src[0:n].
template <int U, typename T>
HYBRIDTF_ROW_INLINE void AxpyRow(T* __restrict acc, T x, const T* __restrict src, int64_t n) {
  const int64_t m = U > 0 ? U : n;
  for (int64_t j = 0; j < m; ++j) acc[j] += x * src[j];
}

}  // namespace matmul_rows
}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_ROWS_H_
