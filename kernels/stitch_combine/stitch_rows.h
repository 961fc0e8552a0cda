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
template <int D, typename T, typename Idx>
inline void WriteRow(Combiner combiner, const T* rows, int64_t dim, const Idx* inverse,
                     const T* weights, int64_t pb, int64_t pe, T* out) {
  if (combiner == Combiner::kNone) {
    CopyRow<D>(out, rows + static_cast<int64_t>(inverse[pb]) * dim, dim);
    return;
  }
  std::fill(out, out + dim, T(0));
  const T denom = Denominator(combiner, weights, pb, pe);
  if (pe == pb || denom == T(0)) return;
  for (int64_t i = pb; i < pe; ++i) {
    const T* src = rows + static_cast<int64_t>(inverse[i]) * dim;
    if (weights) {
      const T w = weights[i];
      for (int64_t c = 0; c < dim; ++c) out[c] += w * src[c];
    } else {
      AddRow<D>(out, src, dim);
    }
  }
  if (combiner != Combiner::kSum) {
    for (int64_t c = 0; c < dim; ++c) out[c] /= denom;
  }
}

}  // namespace rows
}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_ROWS_H_
