// CPU implementation of the fused sparse optimizer updates. See sparse_apply_impl.h.
#include "kernels/sparse_apply/sparse_apply_impl.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/adam_math.h"
#include "kernels/common/dispatch_dim.h"
#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace sparse_apply {

namespace {

// Rows of a big table are touched in random order: prefetch the rows a few
// gradient rows ahead so that memory latency overlaps with the arithmetic.
constexpr int64_t kPrefetchDistance = 8;

template <typename Idx>
inline void PrefetchRow(const SparseGrad<Idx>& grad, int64_t u, int64_t end, float* a, float* b) {
  if (u + kPrefetchDistance < end) {
    const int64_t row = static_cast<int64_t>(grad.indices[u + kPrefetchDistance]) * grad.dim;
    __builtin_prefetch(a + row, 1);
    if (b != nullptr) __builtin_prefetch(b + row, 1);
  }
}

}  // namespace

template <typename Idx>
ImplStatus ValidateIndices(const SparseGrad<Idx>& grad, int64_t rows) {
  // Fast path: strictly ascending rows in range (what sorted unique_partition gives) are distinct.
  bool ascending = true;
  for (int64_t u = 0; u < grad.num && ascending; ++u) {
    const int64_t r = static_cast<int64_t>(grad.indices[u]);
    ascending = r >= 0 && r < rows && (u == 0 || r > static_cast<int64_t>(grad.indices[u - 1]));
  }
  if (ascending) return ImplStatus::Ok();
  std::vector<bool> seen(static_cast<size_t>(rows), false);
  for (int64_t u = 0; u < grad.num; ++u) {
    const int64_t r = static_cast<int64_t>(grad.indices[u]);
    if (r < 0 || r >= rows) {
      return ImplStatus::InvalidArgument("indices[" + std::to_string(u) +
                                         "] = " + std::to_string(r) + " is out of range [0, " +
                                         std::to_string(rows) + ") of the table's rows.");
    }
    if (seen[r]) {
      return ImplStatus::InvalidArgument(
          "indices[" + std::to_string(u) + "] = " + std::to_string(r) +
          " is repeated; fused sparse updates need distinct rows (sum duplicate gradients "
          "first, as unique_partition + stitch_combine's gradient do).");
    }
    seen[r] = true;
  }
  return ImplStatus::Ok();
}

// Per-row updates; the rows of var, slots and gradient never overlap.
template <int D>
inline void SgdRow(float* __restrict w, const float* __restrict g, float lr, int64_t dim) {
  const int64_t d = D ? D : dim;
  for (int64_t c = 0; c < d; ++c) w[c] = w[c] + (-g[c]) * lr;
}

template <int D>
inline void AdagradRow(float* __restrict w, float* __restrict a, const float* __restrict g,
                       float neg_lr, float eps, int64_t dim) {
  const int64_t d = D ? D : dim;
  for (int64_t c = 0; c < d; ++c) {
    const float acc = a[c] + g[c] * g[c];
    a[c] = acc;
    w[c] = w[c] + (neg_lr * g[c]) / std::sqrt(acc + eps);
  }
}

template <int D, typename Idx>
HYBRIDTF_MULTIVERSION void SgdRows(float* var, const SparseGrad<Idx>& grad, int64_t begin,
                                   int64_t end, float lr) {
  const int64_t dim = grad.dim;
  for (int64_t u = begin; u < end; ++u) {
    PrefetchRow(grad, u, end, var, nullptr);
    SgdRow<D>(var + static_cast<int64_t>(grad.indices[u]) * dim, grad.values + u * dim, lr, dim);
  }
}

template <typename Idx>
void Sgd(float* var, const SparseGrad<Idx>& grad, float lr, const ParallelFor& pf) {
  DispatchDim(grad.dim, [&](auto width) {
    constexpr int D = decltype(width)::value;
    pf(grad.num, 2 * grad.dim,
       [&](int64_t begin, int64_t end) { SgdRows<D>(var, grad, begin, end, lr); });
  });
}

template <int D, typename Idx>
HYBRIDTF_MULTIVERSION void AdagradRows(float* var, float* acc, const SparseGrad<Idx>& grad,
                                       int64_t begin, int64_t end, float neg_lr, float eps) {
  const int64_t dim = grad.dim;
  for (int64_t u = begin; u < end; ++u) {
    PrefetchRow(grad, u, end, var, acc);
    const int64_t row = static_cast<int64_t>(grad.indices[u]) * dim;
    AdagradRow<D>(var + row, acc + row, grad.values + u * dim, neg_lr, eps, dim);
  }
}

template <typename Idx>
void Adagrad(float* var, float* acc, const SparseGrad<Idx>& grad, float lr, float eps,
             const ParallelFor& pf) {
  const int64_t dim = grad.dim;
  const float neg_lr = -lr;
  DispatchDim(dim, [&](auto width) {
    constexpr int D = decltype(width)::value;
    pf(grad.num, 8 * dim, [&](int64_t begin, int64_t end) {
      AdagradRows<D>(var, acc, grad, begin, end, neg_lr, eps);
    });
  });
}

HYBRIDTF_MULTIVERSION void DecayMoments(float* __restrict m, float* __restrict v, int64_t begin,
                                        int64_t end, float c1, float c2) {
  for (int64_t i = begin; i < end; ++i) {
    m[i] = adam_math::Decay(m[i], c1);
    v[i] = adam_math::Decay(v[i], c2);
  }
}

HYBRIDTF_MULTIVERSION void MoveAll(float* __restrict var, const float* __restrict m,
                                   const float* __restrict v, int64_t begin, int64_t end,
                                   float alpha, float eps) {
  for (int64_t i = begin; i < end; ++i) {
    var[i] = adam_math::Step(var[i], m[i], v[i], alpha, eps);
  }
}

template <typename Idx>
void Adam(float* var, float* m, float* v, int64_t rows, const SparseGrad<Idx>& grad, float alpha,
          float c1, float c2, float eps, const ParallelFor& pf) {
  const int64_t dim = grad.dim;
  const int64_t total = rows * dim;
  pf(total, 4, [&](int64_t begin, int64_t end) {  // moments of every row decay
    DecayMoments(m, v, begin, end, c1, c2);
  });
  pf(grad.num, 4 * dim, [&](int64_t begin, int64_t end) {  // touched rows get the gradient
    for (int64_t u = begin; u < end; ++u) {
      PrefetchRow(grad, u, end, m, v);
      const int64_t row = static_cast<int64_t>(grad.indices[u]) * dim;
      const float* g = grad.values + u * dim;
      for (int64_t c = 0; c < dim; ++c) {
        m[row + c] = m[row + c] + g[c] * c1;
        v[row + c] = v[row + c] + (g[c] * g[c]) * c2;
      }
    }
  });
  pf(total, 8, [&](int64_t begin, int64_t end) {  // every row moves
    MoveAll(var, m, v, begin, end, alpha, eps);
  });
}

template <int D>
inline void LazyAdamRow(float* __restrict w, float* __restrict m, float* __restrict v,
                        const float* __restrict g, float alpha, float c1, float c2, float eps,
                        int64_t dim) {
  const int64_t d = D ? D : dim;
  for (int64_t c = 0; c < d; ++c) {
    float mi = m[c];
    float vi = v[c];
    mi = adam_math::FirstMoment(mi, g[c], c1);
    vi = adam_math::SecondMoment(vi, g[c], c2);
    m[c] = mi;
    v[c] = vi;
    w[c] = adam_math::Step(w[c], mi, vi, alpha, eps);
  }
}

template <int D, typename Idx>
HYBRIDTF_MULTIVERSION void LazyAdamRows(float* var, float* m, float* v, const SparseGrad<Idx>& grad,
                                        int64_t begin, int64_t end, float alpha, float c1, float c2,
                                        float eps) {
  const int64_t dim = grad.dim;
  for (int64_t u = begin; u < end; ++u) {
    PrefetchRow(grad, u, end, m, v);
    if (u + kPrefetchDistance < end) {
      __builtin_prefetch(var + static_cast<int64_t>(grad.indices[u + kPrefetchDistance]) * dim, 1);
    }
    const int64_t row = static_cast<int64_t>(grad.indices[u]) * dim;
    LazyAdamRow<D>(var + row, m + row, v + row, grad.values + u * dim, alpha, c1, c2, eps, dim);
  }
}

template <typename Idx>
void LazyAdam(float* var, float* m, float* v, const SparseGrad<Idx>& grad, float alpha, float c1,
              float c2, float eps, const ParallelFor& pf) {
  DispatchDim(grad.dim, [&](auto width) {
    constexpr int D = decltype(width)::value;
    pf(grad.num, 12 * grad.dim, [&](int64_t begin, int64_t end) {
      LazyAdamRows<D>(var, m, v, grad, begin, end, alpha, c1, c2, eps);
    });
  });
}

#define HYBRIDTF_INSTANTIATE(Idx)                                                                  \
  template ImplStatus ValidateIndices<Idx>(const SparseGrad<Idx>&, int64_t);                       \
  template void Sgd<Idx>(float*, const SparseGrad<Idx>&, float, const ParallelFor&);               \
  template void Adagrad<Idx>(float*, float*, const SparseGrad<Idx>&, float, float,                 \
                             const ParallelFor&);                                                  \
  template void Adam<Idx>(float*, float*, float*, int64_t, const SparseGrad<Idx>&, float, float,   \
                          float, float, const ParallelFor&);                                       \
  template void LazyAdam<Idx>(float*, float*, float*, const SparseGrad<Idx>&, float, float, float, \
                              float, const ParallelFor&);

HYBRIDTF_INSTANTIATE(int32_t)
HYBRIDTF_INSTANTIATE(int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace sparse_apply
}  // namespace hybridtf
