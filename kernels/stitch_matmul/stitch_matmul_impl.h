// TF-free implementation layer of StitchConcatMatMul (CPU): the product of a
// StitchConcat matrix and a dense kernel, computed through the distinct rows.
//
// A CTR model's first dense layer multiplies the concatenation X = [field_0,
// field_1, ..., dense_0, ...] ([batch, width]) by its kernel K ([width, units]).
// Block by block, X @ K = sum over pieces k of X_k @ K_k, where K_k is the
// kernel's rows [column_k, column_k + width_k). A field's piece only holds
// gathered rows of its distinct ids, so
//
//   X_f @ K_f = combine over the row's positions i of rows[inverse[i]] @ K_f
//
// and rows[u] @ K_f can be computed once per distinct row u (the projection
// P_f[u]) instead of once per position: with Zipf-distributed ids a field
// touches far fewer distinct rows than the batch has rows. The same holds
// backward: with S_f[u] = sum of the (combiner-scaled) output-gradient rows of
// the positions that read u,
//
//   dK_f = sum_u rows[u]^T S_f[u]        d_rows[u] += S_f[u] @ K_f^T
//
// so the gradient of the embedding rows comes out per distinct row, ready for
// the sparse update, and neither X nor its gradient is ever written.
//
// Which distinct rows a field reads: a packed chain with sorted unique ids gives
// every member table one contiguous range of distinct rows, so a field reads a
// range [lo, hi) no longer than its positions. A field for which that is not
// cheaper (a long range: unsorted chains, a table shared by many fields; bags
// with more distinct rows than the batch has rows) is "pooled" instead: each
// output row is combined from its positions as StitchConcat writes it, then
// multiplied by the block. Same math.
//
// The results equal the unfused matmul up to float rounding (the sums run in a
// different order). They do not depend on the number of threads: forward, the
// pieces are summed in a fixed number of chunks (fixed by the layout) whose
// partial results are added in chunk order; backward, every distinct row, every
// kernel row and every dense-input row is summed by exactly one task.
#ifndef HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_IMPL_H_
#define HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"

namespace hybridtf {
namespace stitch_combine {

// out[batch, units] = ForwardConcat(groups, pieces) @ kernel[width, units].
// Every piece's field has `batch` output rows (checked by the caller). The
// inverse indices of the placed fields are checked here (InvalidArgument when
// one is outside its group's rows; the outputs are then undefined).
template <typename T, typename Idx>
ImplStatus ForwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                               const std::vector<ConcatPiece<T>>& pieces, int64_t batch,
                               const T* kernel, int64_t units, T* out,
                               const ParallelFor& parallel_for);

// Gradients of ForwardConcatMatMul for grad = d out ([batch, units]):
// d_rows[g] ([groups[g].num_rows, dim_g], every row written), d_pieces[k]
// ([batch, width_k] for dense pieces; ignored for field pieces) and d_kernel
// ([width, units], every row written). groups[g].rows must be set. Checks
// the inverse indices as ForwardConcatMatMul does.
template <typename T, typename Idx>
ImplStatus BackwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                                const std::vector<ConcatPiece<T>>& pieces, int64_t batch,
                                const T* kernel, int64_t units, const T* grad,
                                const std::vector<T*>& d_rows, const std::vector<T*>& d_pieces,
                                T* d_kernel, const ParallelFor& parallel_for);

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_IMPL_H_
