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

// Element k = i * dim + c (of a lookup's output or an update's gradient):
// the offset of column c of id i's hot entry in the tier, or -1 when id i is
// not hot (entry[i] < 0).
HYBRIDTF_HD inline int64_t ElementOffset(int64_t row_floats, int64_t dim, const int32_t* entry,
                                         int64_t k) {
  const int64_t i = k / dim;
  const int32_t e = entry[i];
  return e < 0 ? -1 : int64_t{e} * row_floats + (k - i * dim);
}

// out[k] = element k's hot float (left untouched when its id is not hot).
HYBRIDTF_HD inline void CopyElem(const float* hot, int64_t row_floats, int64_t dim,
                                 const int32_t* entry, float* out, int64_t k) {
  const int64_t at = ElementOffset(row_floats, dim, entry, k);
  if (at >= 0) out[k] = hot[at];
}

// out[i] = the hot row of ids[i] (untouched when not hot); entry[i] = its entry or -1.
HYBRIDTF_HD inline void LookupRange(const HotIndex& index, const float* hot, int64_t row_floats,
                                    int64_t dim, const int64_t* ids, float* out, int32_t* entry,
                                    int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    entry[i] = FindEntry(index, ids[i]);
    for (int64_t c = 0; c < dim; ++c) CopyElem(hot, row_floats, dim, entry, out, i * dim + c);
  }
}

// One element (column) of one row's update: the per-id loops below and the
// CUDA kernels (one thread per element, so a warp's accesses are contiguous)
// run the same float operations.
HYBRIDTF_HD inline void SgdElem(float* w, float g, float lr) { *w = Add(*w, Mul(-g, lr)); }

HYBRIDTF_HD inline void AdagradElem(float* w, float* a, float g, float lr, float eps) {
  const float acc = Add(*a, Mul(g, g));
  *a = acc;
  *w = Add(*w, Div(Mul(-lr, g), Sqrt(Add(acc, eps))));
}

HYBRIDTF_HD inline void LazyAdamElem(float* w, float* m, float* v, float g, float alpha, float c1,
                                     float c2, float eps) {
  const float mi = Add(Add(*m, Mul(-*m, c1)), Mul(g, c1));
  const float vi = Add(Add(*v, Mul(-*v, c2)), Mul(Mul(g, g), c2));
  *m = mi;
  *v = vi;
  *w = *w - Div(Mul(mi, alpha), Add(Sqrt(vi), eps));
}

HYBRIDTF_HD inline void SgdRange(const int32_t* entry, float* hot, int64_t row_floats, int64_t dim,
                                 const float* grad, float lr, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (entry[i] < 0) continue;
    float* w = hot + int64_t{entry[i]} * row_floats;
    const float* g = grad + i * dim;
    for (int64_t c = 0; c < dim; ++c) SgdElem(w + c, g[c], lr);
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
    for (int64_t c = 0; c < dim; ++c) AdagradElem(w + c, a + c, g[c], lr, eps);
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
    for (int64_t c = 0; c < dim; ++c) LazyAdamElem(w + c, m + c, v + c, g[c], alpha, c1, c2, eps);
  }
}

}  // namespace hot
}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_HOT_H_
