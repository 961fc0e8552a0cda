// The hot tier's lookup and update bodies, shared by the CUDA kernels
// (hybrid_hash_impl.cu, one index per thread) and host loops (the harness
// hybrid_hash_impl_test.cu runs the same code on the CPU): each function
// handles the index range [begin, end). No CUDA or TensorFlow headers.
//
// The hot tier on a device is a dense array of entries of row_floats floats
// (the row, then its optimizer slots, as in the CPU store) plus a HotIndex:
// the hot ids ascending with their entries, uploaded after each flush, so a
// lookup is a binary search. Updates take the entry each lookup found
// (-1: not hot, left to the cold tier on the host).
//
// The float operations are those of the CPU store (hybrid_hash_apply_impl.cc,
// i.e. Keras 2.15); on the device they use the _rn intrinsics so that nvcc
// never contracts them into FMAs: device and host results are bitwise equal.
#ifndef HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_HOT_H_
#define HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_HOT_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HYBRIDTF_HD __host__ __device__
#else
#define HYBRIDTF_HD
#endif

namespace hybridtf {
namespace hybrid_hash {
namespace hot {

struct HotIndex {
  const int64_t* ids;      // ascending
  const int32_t* entries;  // entries[j]: the hot entry of ids[j]
  int64_t size;
};

HYBRIDTF_HD inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
HYBRIDTF_HD inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
HYBRIDTF_HD inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
HYBRIDTF_HD inline float Sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

HYBRIDTF_HD inline int32_t FindEntry(const HotIndex& index, int64_t id) {
  int64_t lo = 0, hi = index.size;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (index.ids[mid] < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < index.size && index.ids[lo] == id ? index.entries[lo] : -1;
}

// out[i] = the hot row of ids[i] (untouched when not hot); entry[i] = its entry or -1.
HYBRIDTF_HD inline void LookupRange(const HotIndex& index, const float* hot, int64_t row_floats,
                                    int64_t dim, const int64_t* ids, float* out, int32_t* entry,
                                    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const int32_t e = FindEntry(index, ids[i]);
    entry[i] = e;
    if (e < 0) continue;
    const float* row = hot + int64_t{e} * row_floats;
    for (int64_t c = 0; c < dim; ++c) out[i * dim + c] = row[c];
  }
}

HYBRIDTF_HD inline void SgdRange(const int32_t* entry, float* hot, int64_t row_floats, int64_t dim,
                                 const float* grad, float lr, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (entry[i] < 0) continue;
    float* w = hot + int64_t{entry[i]} * row_floats;
    const float* g = grad + i * dim;
    for (int64_t c = 0; c < dim; ++c) w[c] = Add(w[c], Mul(-g[c], lr));
  }
}

HYBRIDTF_HD inline void AdagradRange(const int32_t* entry, float* hot, int64_t row_floats,
                                     int64_t dim, const float* grad, float lr, float eps,
                                     int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (entry[i] < 0) continue;
    float* w = hot + int64_t{entry[i]} * row_floats;
    float* a = w + dim;
    const float* g = grad + i * dim;
    for (int64_t c = 0; c < dim; ++c) {
      const float acc = Add(a[c], Mul(g[c], g[c]));
      a[c] = acc;
      w[c] = Add(w[c], Div(Mul(-lr, g[c]), Sqrt(Add(acc, eps))));
    }
  }
}

HYBRIDTF_HD inline void LazyAdamRange(const int32_t* entry, float* hot, int64_t row_floats,
                                      int64_t dim, const float* grad, float alpha, float c1,
                                      float c2, float eps, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (entry[i] < 0) continue;
    float* w = hot + int64_t{entry[i]} * row_floats;
    float* m = w + dim;
    float* v = w + 2 * dim;
    const float* g = grad + i * dim;
    for (int64_t c = 0; c < dim; ++c) {
      float mi = m[c];
      float vi = v[c];
      mi = Add(Add(mi, Mul(-mi, c1)), Mul(g[c], c1));
      vi = Add(Add(vi, Mul(-vi, c2)), Mul(Mul(g[c], g[c]), c2));
      m[c] = mi;
      v[c] = vi;
      w[c] = w[c] - Div(Mul(mi, alpha), Add(Sqrt(vi), eps));
    }
  }
}

}  // namespace hot
}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_HOT_H_
