// TF-free implementation layer of StitchFM (CPU): the pairwise interaction of
// a factorization machine (DeepFM's FM part) computed straight from packed
// tables' distinct rows, without the stacked [batch, fields, dim] matrix.
//
// For output row b with fields' (combined) embeddings e_f ([dim] each, the
// pieces of a StitchConcat layout, every piece a field of width dim):
//
//   out[b] = (sum_f e_f)^2 - sum_f e_f^2        (elementwise over dim)
//
// the per-dimension cross term that the FM layer then halves and sums over
// dim. Both sums run over the pieces in column order. The gradient of
// e_f is dy * (2 S) - dy * e_f - dy * e_f (S = sum_f e_f), the three terms the
// unfused graph adds (square of sum, and the two operands of e * e), written
// into the concatenation's gradient layout and summed per distinct row by
// StitchConcat's gradient (BackwardConcat): same rows, same order.
//
// The forward also returns S ([batch, dim]); the gradient takes it back instead
// of gathering every field's rows a second time (S is summed in the same order
// either way, so the gradient is the same to the bit).
#ifndef HYBRIDTF_KERNELS_STITCH_FM_STITCH_FM_IMPL_H_
#define HYBRIDTF_KERNELS_STITCH_FM_STITCH_FM_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"

namespace hybridtf {
namespace stitch_combine {

// Checks that every piece is a field (no dense piece) of a group of width
// `dim` and that batch * pieces * dim fits int64. InvalidArgument otherwise.
template <typename T, typename Idx>
ImplStatus CheckFMLayout(const std::vector<ConcatGroup<T, Idx>>& groups,
                         const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim);

// out[batch, dim] as above and sums[batch, dim] = S. Inverse indices must
// have been validated.
template <typename T, typename Idx>
ImplStatus ForwardFM(const std::vector<ConcatGroup<T, Idx>>& groups,
                     const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim, T* out,
                     T* sums, const ParallelFor& parallel_for);

// d_rows[g] ([num_unique[g], dim], every row written) for grad = d out and
// d_sums = d sums ([batch, dim] each), sums being ForwardFM's S of the same inputs.
template <typename T, typename Idx>
ImplStatus BackwardFM(const std::vector<ConcatGroup<T, Idx>>& groups,
                      const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim,
                      const T* grad, const T* sums, const T* d_sums, const std::vector<T*>& d_rows,
                      const ParallelFor& parallel_for);

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_FM_STITCH_FM_IMPL_H_
