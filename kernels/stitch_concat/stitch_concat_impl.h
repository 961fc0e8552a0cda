// TF-free implementation layer of StitchConcat (CPU): the fields of several
// packed tables' Stitch&Combine layouts (stitch_combine_impl.h) and dense
// matrices written straight into the columns of one concatenated matrix, and
// the gradient back to every table's distinct rows. StitchConcatMatMul
// (kernels/stitch_matmul/) builds on these groups and pieces.
#ifndef HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_IMPL_H_
#define HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"
#include "kernels/stitch_combine/stitch_combine_impl.h"

namespace hybridtf {
namespace stitch_combine {

// Row-major concatenation of fields of several groups and dense matrices
// (StitchConcat). A group is one packed table's chain; a piece is a column
// range [column, column + width) of the [batch, width] output, filled from
// field `field` of group `group` (its output_rows(field) must be batch), or,
// with group == -1, from the [batch, width] matrix `dense`.
template <typename T, typename Idx>
struct ConcatGroup {
  const Layout* layout;
  const T* rows;
  int64_t dim;
  const Idx* inverse;
  int64_t num_rows;  // rows of the table rows[] (num_unique)
};

template <typename T>
struct ConcatPiece {
  int group;
  int field;
  const T* dense;
  int64_t width;
  int64_t column;
};

template <typename T, typename Idx>
void ForwardConcat(const std::vector<ConcatGroup<T, Idx>>& groups,
                   const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t width, T* out,
                   const ParallelFor& parallel_for);

// Gradient of ForwardConcat with respect to every group's rows: d_rows[g] is
// [num_unique[g], dim_g]. Each distinct row's gradient is summed row by row
// (output row, then piece in column order); for a row that only one field
// reaches (one field per table, the usual case) that is StitchCombine's
// ascending-position order. Dense pieces are ignored (their gradient is a
// column slice). grad is the [batch, width] gradient of the concatenation,
// or, when `broadcast`, [batch] values: every column of row b has gradient
// grad[b] (the concatenation was summed over its columns), summed in the same
// order. InvalidArgument when a placed field's inverse index is outside
// [0, num_unique[g]) (checked before any is used).
template <typename T, typename Idx>
ImplStatus BackwardConcat(const std::vector<ConcatGroup<T, Idx>>& groups,
                          const std::vector<ConcatPiece<T>>& pieces,
                          const std::vector<int64_t>& num_unique, int64_t batch, int64_t width,
                          const T* grad, bool broadcast, const std::vector<T*>& d_rows,
                          const ParallelFor& parallel_for);

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_CONCAT_STITCH_CONCAT_IMPL_H_
