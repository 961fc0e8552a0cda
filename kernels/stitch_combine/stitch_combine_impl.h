// TF-free implementation layer of the fused Stitch&Combine algorithm (CPU).
//
// After a packed lookup has gathered the rows of the distinct ids
// (rows[u] for u in [0, U)), Stitch&Combine writes the per-field outputs in one
// pass: for every output row it gathers rows[inverse[i]] over the row's
// positions i and combines them. Fields are consecutive position ranges of the
// packed id vector:
//
//   field f owns positions [P_f, P_f + field_sizes[f]), P_f = sum of earlier sizes
//   * combiner "none" (one-hot): one output row per position,
//       out_f[r] = rows[inverse[P_f + r]]
//   * "sum" / "mean" / "sqrtn" (multi-hot bags): field_segments[f] bags whose
//     lengths are the next field_segments[f] entries of segment_lengths;
//       sum   : out = sum_i w_i * rows[inverse[i]]
//       mean  : out = sum / sum_i w_i            (w_i = 1 without weights)
//       sqrtn : out = sum / sqrt(sum_i w_i^2)
//     an empty bag (or a zero denominator) gives a zero row.
//
// The gradient maps per-field output gradients back to d_rows[U, D] (w_i = 1
// for one-hot fields: weights only apply to bags):
//   d_rows[u] = sum over positions i with inverse[i] == u, in ascending i, of
//               w_i * grad[row(i)] / denom(row(i))
// Summation order is fixed (ascending position), so results do not depend on
// the number of threads.
#ifndef HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_IMPL_H_
#define HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_IMPL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace stitch_combine {

enum class Combiner { kNone = 0, kSum = 1, kMean = 2, kSqrtn = 3 };

// Largest width (embedding dim or dense width) an attribute may give.
constexpr int64_t kMaxWidth = (int64_t{1} << 31) - 1;

// Denominator of a bag's combiner over positions [begin, end) (weights may be
// null: all 1); 0 means the bag's output (and gradient) is zero.
template <typename T>
T Denominator(Combiner combiner, const T* weights, int64_t begin, int64_t end) {
  if (combiner == Combiner::kNone || combiner == Combiner::kSum) return T(1);
  T total = T(0);
  for (int64_t i = begin; i < end; ++i) {
    const T w = weights ? weights[i] : T(1);
    total += combiner == Combiner::kMean ? w : w * w;
  }
  return combiner == Combiner::kSqrtn ? std::sqrt(total) : total;
}

// Parses "none" / "sum" / "mean" / "sqrtn"; returns false otherwise.
bool ParseCombiner(const std::string& name, Combiner* combiner);

// Where every output row of every field reads its positions. Built once per
// call from the field description, validated against the number of positions.
class Layout {
 public:
  ImplStatus Build(const std::vector<Combiner>& combiners, const int64_t* field_sizes,
                   const int64_t* field_segments, const int64_t* segment_lengths,
                   int64_t num_segment_lengths, int64_t num_positions);

  int num_fields() const { return static_cast<int>(combiners_.size()); }
  Combiner combiner(int f) const { return combiners_[f]; }
  // The combiner to compute field f's rows with: "none" for a bag field whose
  // bags all hold exactly one id and no weights (a copy of that id's row,
  // which is what sum, mean and sqrtn give: x / 1 == x), else combiner(f).
  Combiner row_combiner(int f, bool weighted) const {
    return !weighted && single_id_bags_[f] ? Combiner::kNone : combiners_[f];
  }
  int64_t output_rows(int f) const { return row_offset_[f + 1] - row_offset_[f]; }
  int64_t total_rows() const { return row_offset_.back(); }
  int64_t num_positions() const { return num_positions_; }
  // Global output row r (fields concatenated) -> its field.
  int FieldOfRow(int64_t r) const;
  // Global index of field f's first output row (f == num_fields(): total_rows()).
  int64_t FirstRow(int f) const { return row_offset_[f]; }
  // Positions [begin, end) of global output row r of field f.
  void Positions(int f, int64_t r, int64_t* begin, int64_t* end) const;
  // All positions [begin, end) of field f.
  void FieldPositions(int f, int64_t* begin, int64_t* end) const {
    *begin = pos_offset_[f];
    *end = pos_offset_[f + 1];
  }

 private:
  std::vector<Combiner> combiners_;
  std::vector<int64_t> row_offset_;  // [F + 1] global output-row offsets
  std::vector<int64_t> pos_offset_;  // [F + 1] position offsets
  // For bag fields: bag_begin_[bag_index_[f] + local_row] = first position.
  std::vector<int64_t> bag_index_;  // [F] offset into bag_begin_, -1 for "none"
  std::vector<int64_t> bag_begin_;
  std::vector<char> single_id_bags_;  // [F] bag field whose bags all have length 1
  int64_t num_positions_ = 0;
};

// The shape of a one-hot field's output of `rows` rows of width `dim` when its
// ids had shape `id_shape` (-1: unknown, at most one entry, resolved so that
// the ids' elements number `rows`): id_shape + [dim]. InvalidArgument naming
// field `field` when the ids' shape cannot hold `rows` ids or a product
// overflows.
ImplStatus OutputDims(const std::vector<int64_t>& id_shape, int64_t rows, int64_t dim, int field,
                      std::vector<int64_t>* dims);

// Checks every inverse index is in [0, num_unique) (names the first bad one).
template <typename Idx>
ImplStatus ValidateInverse(const Idx* inverse, int64_t n, int64_t num_unique,
                           const ParallelFor& parallel_for);

// outputs[f] points to output_rows(f) * dim values. weights may be null.
template <typename T, typename Idx>
void Forward(const Layout& layout, const T* rows, int64_t dim, const Idx* inverse, const T* weights,
             T* const* outputs, const ParallelFor& parallel_for);

// grads[f] points to output_rows(f) * dim values; d_rows to num_unique * dim.
template <typename T, typename Idx>
void Backward(const Layout& layout, const T* const* grads, int64_t dim, const Idx* inverse,
              const T* weights, int64_t num_unique, T* d_rows, const ParallelFor& parallel_for);

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_IMPL_H_
