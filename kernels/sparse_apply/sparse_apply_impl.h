// TF-free implementation layer of the fused sparse optimizer updates.
//
// One call updates one packed table for a gradient given as distinct row
// indices and their gradient rows (the packed lookup's gather gives exactly
// that). Each update reproduces, element by element and in the same floating
// point operation order, what the Keras 2.15 optimizer does for an
// IndexedSlices gradient, so a packed model trains exactly like the plain one:
//
//   Sgd      var[r] = var[r] + (-g) * lr                      (momentum 0)
//   Adagrad  acc[r] = acc[r] + g * g
//            var[r] = var[r] + ((-lr) * g) / sqrt(acc[r] + eps)
//   Adam     every row:  m = m + (-m) * c1;  v = v + (-v) * c2
//            touched:    m[r] = m[r] + g * c1;  v[r] = v[r] + (g * g) * c2
//            every row:  var = var - (m * alpha) / (sqrt(v) + eps)
//   LazyAdam the Adam formulas on the touched rows only (moments of other
//            rows do not decay; a different optimizer, opt-in).
//
// (c1 = 1 - beta_1, c2 = 1 - beta_2, alpha = lr * sqrt(1 - beta_2^t) /
// (1 - beta_1^t), computed by the caller as Keras does.)
#ifndef HYBRIDTF_KERNELS_SPARSE_APPLY_SPARSE_APPLY_IMPL_H_
#define HYBRIDTF_KERNELS_SPARSE_APPLY_SPARSE_APPLY_IMPL_H_

#include <cstdint>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace sparse_apply {

// Sparse rows of a gradient: indices[u] in [0, rows), values[u * dim ...].
template <typename Idx>
struct SparseGrad {
  const Idx* indices;
  const float* values;
  int64_t num;  // number of gradient rows
  int64_t dim;
};

// Checks indices are in [0, rows) and distinct (marks in `seen`, size rows).
template <typename Idx>
ImplStatus ValidateIndices(const SparseGrad<Idx>& grad, int64_t rows);

template <typename Idx>
void Sgd(float* var, const SparseGrad<Idx>& grad, float lr, const ParallelFor& pf);

template <typename Idx>
void Adagrad(float* var, float* acc, const SparseGrad<Idx>& grad, float lr, float eps,
             const ParallelFor& pf);

template <typename Idx>
void Adam(float* var, float* m, float* v, int64_t rows, const SparseGrad<Idx>& grad, float alpha,
          float c1, float c2, float eps, const ParallelFor& pf);

template <typename Idx>
void LazyAdam(float* var, float* m, float* v, const SparseGrad<Idx>& grad, float alpha, float c1,
              float c2, float eps, const ParallelFor& pf);

}  // namespace sparse_apply
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_SPARSE_APPLY_SPARSE_APPLY_IMPL_H_
