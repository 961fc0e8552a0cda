// Row kernels shared by the StitchCombine and StitchConcat CPU layers
// (stitch_combine_impl.cc, stitch_concat_impl.cc): copies, sums and one
// combined output row, with the width known at compile time for the common
// embedding dims (DispatchDim); D == 0 means "use dim". Shared by the
// stitch_combine and stitch_concat families.
#ifndef HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_ROWS_H_
#define HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_ROWS_H_

#include <algorithm>
#include <cstdint>

#include "kernels/stitch_combine/stitch_combine_impl.h"

namespace hybridtf {
namespace stitch_combine {
namespace rows {

template <int D, typename T>
inline void CopyRow(T* __restrict out, const T* __restrict src, int64_t dim) {
  const int64_t d = D ? D : dim;
  for (int64_t c = 0; c < d; ++c) out[c] = src[c];
}

template <int D, typename T>
inline void AddRow(T* __restrict acc, const T* __restrict src, int64_t dim) {
  const int64_t d = D ? D : dim;
  for (int64_t c = 0; c < d; ++c) acc[c] += src[c];
}

// acc[0:dim] += v (D == 0: dim from the argument).
template <int D, typename T>
inline void AddScalar(T* __restrict acc, T v, int64_t dim) {
  const int64_t d = D > 0 ? D : dim;
  for (int64_t c = 0; c < d; ++c) acc[c] += v;
}

// Writes one output row from positions [pb, pe) (one position for "none").
// An unweighted bag starts from its first row (no zero fill), and a mean or
// sqrtn over one id skips the division by 1 (exact either way).
template <int D, typename T, typename Idx>
inline void WriteRow(Combiner combiner, const T* rows, int64_t dim, const Idx* inverse,
                     const T* weights, int64_t pb, int64_t pe, T* out) {
  const int64_t d = D ? D : dim;
  if (combiner == Combiner::kNone) {
    CopyRow<D>(out, rows + static_cast<int64_t>(inverse[pb]) * dim, dim);
    return;
  }
  const T denom = Denominator(combiner, weights, pb, pe);
  if (pe == pb || denom == T(0)) {
    std::fill(out, out + d, T(0));
    return;
  }
  if (weights) {
    std::fill(out, out + d, T(0));
    for (int64_t i = pb; i < pe; ++i) {
      const T* src = rows + static_cast<int64_t>(inverse[i]) * dim;
      const T w = weights[i];
      for (int64_t c = 0; c < d; ++c) out[c] += w * src[c];
    }
  } else {
    CopyRow<D>(out, rows + static_cast<int64_t>(inverse[pb]) * dim, dim);
    for (int64_t i = pb + 1; i < pe; ++i) {
      AddRow<D>(out, rows + static_cast<int64_t>(inverse[i]) * dim, dim);
    }
  }
  if (combiner != Combiner::kSum && denom != T(1)) {
    for (int64_t c = 0; c < d; ++c) out[c] /= denom;
  }
}

}  // namespace rows
}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_ROWS_H_
