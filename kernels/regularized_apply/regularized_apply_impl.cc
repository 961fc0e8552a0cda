// CPU implementation of the regularized fused updates. See regularized_apply_impl.h.
#include "kernels/regularized_apply/regularized_apply_impl.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "kernels/common/adam_math.h"
#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace regularized_apply {

namespace {

// A run of rows updated row by row: a regularized range (dense formula), or,
// for Adam, a run of unregularized rows (every row decays and moves).
struct Segment {
  int64_t begin;
  int64_t end;
  bool regularized;
  float l1;
  float l2;
};

__attribute__((always_inline)) inline float Sign(float w) {
  return static_cast<float>((w > 0.f) - (w < 0.f));
}

// The row-walked updates over n contiguous values (whole rows): `gb` is the
// batch gradient of those values, or null for rows absent from the batch
// (gradient 0). Each is one flat loop per case, so that it vectorizes;
// every value takes the same float operations in the same order as Keras's
// dense formula (see the header): `gb + (l1 * sign(w) + w * (2 * l2))`, with
// gb = 0 for absent rows.
HYBRIDTF_MULTIVERSION void SgdRegularized(float* __restrict w, const float* __restrict gb,
                                          int64_t n, float l1, float two_l2, float lr) {
  if (gb != nullptr) {
    for (int64_t i = 0; i < n; ++i)
      w[i] = w[i] + (-(gb[i] + (l1 * Sign(w[i]) + w[i] * two_l2))) * lr;
  } else {
    for (int64_t i = 0; i < n; ++i) w[i] = w[i] + (-(0.f + (l1 * Sign(w[i]) + w[i] * two_l2))) * lr;
  }
}

HYBRIDTF_MULTIVERSION void AdagradRegularized(float* __restrict w, float* __restrict a,
                                              const float* __restrict gb, int64_t n, float l1,
                                              float two_l2, float lr, float eps) {
  if (gb != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gb[i] + (l1 * Sign(w[i]) + w[i] * two_l2);
      const float acc = a[i] + g * g;
      a[i] = acc;
      w[i] = w[i] - (lr * g) / std::sqrt(acc + eps);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float g = 0.f + (l1 * Sign(w[i]) + w[i] * two_l2);
      const float acc = a[i] + g * g;
      a[i] = acc;
      w[i] = w[i] - (lr * g) / std::sqrt(acc + eps);
    }
  }
}

HYBRIDTF_MULTIVERSION void AdamRegularized(float* __restrict w, float* __restrict m,
                                           float* __restrict v, const float* __restrict gb,
                                           int64_t n, float l1, float two_l2, const Hyper& h) {
  const float c1 = h.c1, c2 = h.c2, alpha = h.alpha, eps = h.eps;
  if (gb != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gb[i] + (l1 * Sign(w[i]) + w[i] * two_l2);
      const float mi = m[i] + (g - m[i]) * c1;
      const float vi = v[i] + (g * g - v[i]) * c2;
      m[i] = mi;
      v[i] = vi;
      w[i] = adam_math::Step(w[i], mi, vi, alpha, eps);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float g = 0.f + (l1 * Sign(w[i]) + w[i] * two_l2);
      const float mi = m[i] + (g - m[i]) * c1;
      const float vi = v[i] + (g * g - v[i]) * c2;
      m[i] = mi;
      v[i] = vi;
      w[i] = adam_math::Step(w[i], mi, vi, alpha, eps);
    }
  }
}

// Adam, unregularized rows: Keras's sparse formula (every row decays and moves).
HYBRIDTF_MULTIVERSION void AdamUnregularized(float* __restrict w, float* __restrict m,
                                             float* __restrict v, const float* __restrict gb,
                                             int64_t n, const Hyper& h) {
  const float c1 = h.c1, c2 = h.c2, alpha = h.alpha, eps = h.eps;
  if (gb != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const float mi = adam_math::FirstMoment(m[i], gb[i], c1);
      const float vi = adam_math::SecondMoment(v[i], gb[i], c2);
      m[i] = mi;
      v[i] = vi;
      w[i] = adam_math::Step(w[i], mi, vi, alpha, eps);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float mi = adam_math::Decay(m[i], c1);
      const float vi = adam_math::Decay(v[i], c2);
      m[i] = mi;
      v[i] = vi;
      w[i] = adam_math::Step(w[i], mi, vi, alpha, eps);
    }
  }
}

template <typename Idx>
int64_t FirstAtOrAfter(const SparseGrad<Idx>& grad, int64_t row) {
  const Idx* it = std::lower_bound(grad.indices, grad.indices + grad.num, row,
                                   [](Idx a, int64_t r) { return static_cast<int64_t>(a) < r; });
  return it - grad.indices;
}

// Values [begin, end) (offsets into the table, whole rows) of one segment, `gb` as above.
void Values(Kind kind, const Segment& seg, int64_t begin, int64_t end, float* var, float* s1,
            float* s2, const float* gb, const Hyper& h) {
  const int64_t n = end - begin;
  float* w = var + begin;
  if (!seg.regularized) {
    AdamUnregularized(w, s1 + begin, s2 + begin, gb, n, h);
    return;
  }
  const float two_l2 = 2.f * seg.l2;
  switch (kind) {
    case Kind::kSgd:
      SgdRegularized(w, gb, n, seg.l1, two_l2, h.lr);
      break;
    case Kind::kAdagrad:
      AdagradRegularized(w, s1 + begin, gb, n, seg.l1, two_l2, h.lr, h.eps);
      break;
    case Kind::kAdam:
    case Kind::kLazyAdam:
      AdamRegularized(w, s1 + begin, s2 + begin, gb, n, seg.l1, two_l2, h);
      break;
  }
}

// Rows [begin, end) of one segment; `u` is the first gradient row at or after `begin`. The runs
// of rows between batch rows are contiguous in the table: each is one flat call.
template <typename Idx>
void SegmentRows(Kind kind, const Segment& seg, int64_t begin, int64_t end, int64_t u, float* var,
                 float* s1, float* s2, const SparseGrad<Idx>& grad, const Hyper& h) {
  const int64_t dim = grad.dim;
  int64_t r = begin;
  while (r < end) {
    const int64_t next = u < grad.num ? std::min(end, static_cast<int64_t>(grad.indices[u])) : end;
    if (next > r) {
      Values(kind, seg, r * dim, next * dim, var, s1, s2, nullptr, h);
      r = next;
      continue;
    }
    Values(kind, seg, r * dim, (r + 1) * dim, var, s1, s2, grad.values + u * dim, h);
    ++u;
    ++r;
  }
}

// A batch row outside every regularized range (Sgd, Adagrad, LazyAdam): kernels/sparse_apply's
// math.
template <typename Idx>
void SparseRow(Kind kind, int64_t u, float* var, float* s1, float* s2, const SparseGrad<Idx>& grad,
               const Hyper& h) {
  const int64_t dim = grad.dim;
  const int64_t row = static_cast<int64_t>(grad.indices[u]) * dim;
  const float* g = grad.values + u * dim;
  float* w = var + row;
  switch (kind) {
    case Kind::kSgd:
      for (int64_t c = 0; c < dim; ++c) w[c] = w[c] + (-g[c]) * h.lr;
      break;
    case Kind::kAdagrad: {
      float* a = s1 + row;
      const float neg_lr = -h.lr;
      for (int64_t c = 0; c < dim; ++c) {
        const float acc = a[c] + g[c] * g[c];
        a[c] = acc;
        w[c] = w[c] + (neg_lr * g[c]) / std::sqrt(acc + h.eps);
      }
      break;
    }
    case Kind::kLazyAdam: {
      float* m = s1 + row;
      float* v = s2 + row;
      for (int64_t c = 0; c < dim; ++c) {
        float mi = m[c];
        float vi = v[c];
        mi = adam_math::FirstMoment(mi, g[c], h.c1);
        vi = adam_math::SecondMoment(vi, g[c], h.c2);
        m[c] = mi;
        v[c] = vi;
        w[c] = adam_math::Step(w[c], mi, vi, h.alpha, h.eps);
      }
      break;
    }
    case Kind::kAdam:
      break;  // Adam walks every row in segments
  }
}

}  // namespace

ImplStatus ValidateRanges(const std::vector<RegRange>& ranges, int64_t rows) {
  int64_t previous_end = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const RegRange& r = ranges[k];
    if (r.begin < previous_end || r.end < r.begin || r.end > rows) {
      return ImplStatus::InvalidArgument(
          "reg_ranges[" + std::to_string(k) + "] = [" + std::to_string(r.begin) + ", " +
          std::to_string(r.end) + ") is not an ascending, non-overlapping row range inside [0, " +
          std::to_string(rows) +
          ") of the table; pass each regularized member table's rows once, in row order.");
    }
    if (!std::isfinite(r.l1) || !std::isfinite(r.l2) || r.l1 < 0.f || r.l2 < 0.f) {
      return ImplStatus::InvalidArgument(
          "reg_l1 / reg_l2 [" + std::to_string(k) + "] must be finite and >= 0, got " +
          std::to_string(r.l1) + " / " + std::to_string(r.l2) + " (Keras regularizer factors).");
    }
    previous_end = r.end;
  }
  return ImplStatus::Ok();
}

template <typename Idx>
bool Ascending(const SparseGrad<Idx>& grad) {
  for (int64_t u = 1; u < grad.num; ++u) {
    if (grad.indices[u] <= grad.indices[u - 1]) return false;
  }
  return true;
}

template <typename Idx>
SparseGrad<Idx> SortedCopy(const SparseGrad<Idx>& grad, std::vector<Idx>* indices,
                           std::vector<float>* values) {
  std::vector<int64_t> order(static_cast<size_t>(grad.num));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return grad.indices[a] < grad.indices[b]; });
  indices->resize(order.size());
  values->resize(order.size() * static_cast<size_t>(grad.dim));
  for (size_t k = 0; k < order.size(); ++k) {
    (*indices)[k] = grad.indices[order[k]];
    std::copy(grad.values + order[k] * grad.dim, grad.values + (order[k] + 1) * grad.dim,
              values->data() + k * grad.dim);
  }
  return SparseGrad<Idx>{indices->data(), values->data(), grad.num, grad.dim};
}

template <typename Idx>
void Apply(Kind kind, float* var, float* s1, float* s2, int64_t rows, const SparseGrad<Idx>& grad,
           const std::vector<RegRange>& ranges, const Hyper& h, const ParallelFor& pf) {
  const int64_t dim = grad.dim;
  // Row-walked segments: the regularized ranges, and for Adam the rows between them too.
  std::vector<Segment> segments;
  int64_t next = 0;
  for (const RegRange& r : ranges) {
    if (kind == Kind::kAdam && r.begin > next) segments.push_back({next, r.begin, false, 0.f, 0.f});
    if (r.end > r.begin) segments.push_back({r.begin, r.end, true, r.l1, r.l2});
    next = r.end;
  }
  if (kind == Kind::kAdam && rows > next) segments.push_back({next, rows, false, 0.f, 0.f});
  std::vector<int64_t> starts(segments.size() + 1, 0);  // prefix sums of segment lengths
  for (size_t k = 0; k < segments.size(); ++k) {
    starts[k + 1] = starts[k] + (segments[k].end - segments[k].begin);
  }
  if (starts.back() > 0) {
    pf(starts.back(), 10 * dim, [&](int64_t begin, int64_t end) {
      size_t k = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
      for (int64_t pos = begin; pos < end; ++k) {
        const Segment& seg = segments[k];
        const int64_t stop = std::min(end, starts[k + 1]);
        const int64_t row_begin = seg.begin + (pos - starts[k]);
        const int64_t row_end = seg.begin + (stop - starts[k]);
        SegmentRows(kind, seg, row_begin, row_end, FirstAtOrAfter(grad, row_begin), var, s1, s2,
                    grad, h);
        pos = stop;
      }
    });
  }
  if (kind == Kind::kAdam || grad.num == 0) return;
  // Batch rows outside every regularized range: the sparse update.
  pf(grad.num, 8 * dim, [&](int64_t begin, int64_t end) {
    const int64_t first = static_cast<int64_t>(grad.indices[begin]);
    size_t k = std::upper_bound(ranges.begin(), ranges.end(), first,
                                [](int64_t row, const RegRange& r) { return row < r.end; }) -
               ranges.begin();
    for (int64_t u = begin; u < end; ++u) {
      const int64_t row = static_cast<int64_t>(grad.indices[u]);
      while (k < ranges.size() && ranges[k].end <= row) ++k;
      if (k < ranges.size() && ranges[k].begin <= row) continue;  // done with its range
      SparseRow(kind, u, var, s1, s2, grad, h);
    }
  });
}

#define HYBRIDTF_INSTANTIATE(Idx)                                                         \
  template bool Ascending<Idx>(const SparseGrad<Idx>&);                                   \
  template SparseGrad<Idx> SortedCopy<Idx>(const SparseGrad<Idx>&, std::vector<Idx>*,     \
                                           std::vector<float>*);                          \
  template void Apply<Idx>(Kind, float*, float*, float*, int64_t, const SparseGrad<Idx>&, \
                           const std::vector<RegRange>&, const Hyper&, const ParallelFor&);

HYBRIDTF_INSTANTIATE(int32_t)
HYBRIDTF_INSTANTIATE(int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace regularized_apply
}  // namespace hybridtf
