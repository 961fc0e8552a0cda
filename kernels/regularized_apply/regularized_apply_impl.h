// TF-free implementation layer of the fused optimizer updates of packed tables
// some of whose member tables carry a Keras L1 / L2 / L1L2 embeddings
// regularizer.
//
// In the plain model, a regularized table's gradient is dense: the
// regularizer's derivative on every row plus the batch rows' gradient, and
// Keras applies its *dense* update formula to the whole table. Unregularized
// tables get Keras's IndexedSlices (sparse) update. One call here updates a
// packed table exactly like that, row by row, in one pass:
//
//   rows in a regularized range [begin, end) with factors (l1, l2):
//     g = gb + (l1 * sign(w) + w * (2 * l2))     gb: the batch gradient row or 0
//     Sgd      w = w + (-g) * lr
//     Adagrad  a = a + g * g;  w = w - (lr * g) / sqrt(a + eps)
//     Adam     m = m + (g - m) * c1;  v = v + (g * g - v) * c2
//              w = w - (m * alpha) / (sqrt(v) + eps)
//     (LazyAdam too: Keras's LazyAdam gets a dense gradient there and runs Adam)
//   other rows: exactly the sparse updates of kernels/sparse_apply (batch rows
//     only; Adam decays every row's moments and moves every row).
//
// Penalties computes the penalties' values themselves (what Keras's callable
// losses return) for every regularized range in one read pass:
//   out[k] = l1 * sum|w| + (2 * l2) * (sum(w * w) / 2)     over rows [begin, end)
// (Keras 2.15's L1 / L2 / L1L2: `l1 * reduce_sum(abs(w))` and
// `2 * l2 * l2_loss(w)`; a factor of 0 adds no term). The sums accumulate in
// double over fixed blocks, combined in block order: the result does not
// depend on the thread count and is within a few float roundings of Keras's.
//
// `l1 * sign(w)` is the gradient of Keras's `l1 * reduce_sum(abs(w))` and
// `w * (2 * l2)` that of `2 * l2 * l2_loss(w)` (= `l2 * reduce_sum(square(w))`),
// both for a loss whose regularization term enters with weight 1, as Keras's
// compiled loss adds `model.losses`. A factor of 0 leaves the row's gradient
// unchanged but the row still takes the dense formula, as in Keras.
#ifndef HYBRIDTF_KERNELS_REGULARIZED_APPLY_REGULARIZED_APPLY_IMPL_H_
#define HYBRIDTF_KERNELS_REGULARIZED_APPLY_REGULARIZED_APPLY_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"
#include "kernels/sparse_apply/sparse_apply_impl.h"

namespace hybridtf {
namespace regularized_apply {

using sparse_apply::SparseGrad;

// Rows [begin, end) of the (local) table regularized with factors l1, l2.
struct RegRange {
  int64_t begin;
  int64_t end;
  float l1;
  float l2;
};

enum class Kind { kSgd, kAdagrad, kAdam, kLazyAdam };

// Scalars of the update (those a kind does not use are ignored).
struct Hyper {
  float lr = 0.f;     // Sgd, Adagrad
  float eps = 0.f;    // Adagrad, Adam
  float alpha = 0.f;  // Adam: lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
  float c1 = 0.f;     // Adam: 1 - beta_1
  float c2 = 0.f;     // Adam: 1 - beta_2
};

// Ranges must be non-empty or empty, inside [0, rows), ascending and not overlapping.
ImplStatus ValidateRanges(const std::vector<RegRange>& ranges, int64_t rows);

// Whether the gradient's indices are strictly ascending (what the packed chain gives).
template <typename Idx>
bool Ascending(const SparseGrad<Idx>& grad);

// Sorted copies of a gradient with distinct rows: `indices` / `values` receive
// the rows in ascending index order; returns a SparseGrad over them.
template <typename Idx>
SparseGrad<Idx> SortedCopy(const SparseGrad<Idx>& grad, std::vector<Idx>* indices,
                           std::vector<float>* values);

// The update. `grad` has distinct, strictly ascending indices in [0, rows);
// `s1` is the Adagrad accumulator or Adam's m, `s2` Adam's v (else null).
template <typename Idx>
void Apply(Kind kind, float* var, float* s1, float* s2, int64_t rows, const SparseGrad<Idx>& grad,
           const std::vector<RegRange>& ranges, const Hyper& h, const ParallelFor& pf);

// out[k] = the penalty of ranges[k] (see the top of this file) of `var` ([rows, dim]).
// Ranges as ValidateRanges accepts them; `out` has ranges.size() values.
ImplStatus Penalties(const float* var, int64_t rows, int64_t dim,
                     const std::vector<RegRange>& ranges, float* out, const ParallelFor& pf);

}  // namespace regularized_apply
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_REGULARIZED_APPLY_REGULARIZED_APPLY_IMPL_H_
