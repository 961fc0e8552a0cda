// CPU implementation of StitchFM and its gradient. See stitch_fm_impl.h.
#include "kernels/stitch_fm/stitch_fm_impl.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace stitch_combine {

namespace {

// Field `piece`'s combined embedding of output row r: a pointer into rows for
// a one-hot field, else the bag combined into `tmp` (as StitchConcat writes it).
template <typename T, typename Idx>
inline const T* CombinedRow(const ConcatGroup<T, Idx>& g, const ConcatPiece<T>& piece, int64_t r,
                            int64_t dim, T* tmp) {
  const Layout& layout = *g.layout;
  int64_t b = 0, e = 0;
  layout.Positions(piece.field, layout.FirstRow(piece.field) + r, &b, &e);
  const Combiner combiner = layout.combiner(piece.field);
  if (combiner == Combiner::kNone) return g.rows + static_cast<int64_t>(g.inverse[b]) * dim;
  std::fill(tmp, tmp + dim, T(0));
  const T denom = Denominator(combiner, static_cast<const T*>(nullptr), b, e);
  if (e == b || denom == T(0)) return tmp;
  for (int64_t i = b; i < e; ++i) {
    const T* src = g.rows + static_cast<int64_t>(g.inverse[i]) * dim;
    for (int64_t c = 0; c < dim; ++c) tmp[c] += src[c];
  }
  if (combiner != Combiner::kSum) {
    for (int64_t c = 0; c < dim; ++c) tmp[c] /= denom;
  }
  return tmp;
}

// s[0:dim] = sum over pieces of row r's embeddings; q (when not null) = sum of their squares.
template <typename T, typename Idx>
HYBRIDTF_MULTIVERSION void RowSums(const std::vector<ConcatGroup<T, Idx>>& groups,
                                   const std::vector<ConcatPiece<T>>& pieces, int64_t r,
                                   int64_t dim, T* tmp, T* s, T* q) {
  std::fill(s, s + dim, T(0));
  if (q != nullptr) std::fill(q, q + dim, T(0));
  for (const ConcatPiece<T>& piece : pieces) {
    const T* e = CombinedRow(groups[piece.group], piece, r, dim, tmp);
    for (int64_t c = 0; c < dim; ++c) s[c] += e[c];
    if (q != nullptr) {
      for (int64_t c = 0; c < dim; ++c) q[c] += e[c] * e[c];
    }
  }
}

// Rows per parallel task's cost estimate: one pass over the row's pieces.
template <typename T>
int64_t RowCost(const std::vector<ConcatPiece<T>>& pieces, int64_t dim) {
  return SaturatingMul(static_cast<int64_t>(pieces.size()), SaturatingMul(dim, 4));
}

}  // namespace

template <typename T, typename Idx>
ImplStatus CheckFMLayout(const std::vector<ConcatGroup<T, Idx>>& groups,
                         const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim) {
  if (pieces.empty()) {
    return ImplStatus::InvalidArgument("StitchFM needs at least one field piece.");
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ConcatPiece<T>& piece = pieces[k];
    if (piece.group < 0) {
      return ImplStatus::InvalidArgument(
          "StitchFM: piece " + std::to_string(k) +
          " is a dense input; the FM interaction takes embedding fields only (num_dense must be "
          "0).");
    }
    if (groups[piece.group].dim != dim) {
      return ImplStatus::InvalidArgument(
          "StitchFM: piece " + std::to_string(k) + " has width " +
          std::to_string(groups[piece.group].dim) + " but piece 0 has " + std::to_string(dim) +
          "; every field of an FM interaction needs the same embedding dim.");
    }
  }
  int64_t n = 0;
  if (!CheckedMul(batch, static_cast<int64_t>(pieces.size()), &n) || !CheckedMul(n, dim, &n)) {
    return ImplStatus::InvalidArgument("StitchFM: batch * fields * dim overflows int64.");
  }
  return ImplStatus::Ok();
}

template <typename T, typename Idx>
ImplStatus ForwardFM(const std::vector<ConcatGroup<T, Idx>>& groups,
                     const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim, T* out,
                     const ParallelFor& parallel_for) {
  const ImplStatus layout = CheckFMLayout(groups, pieces, batch, dim);
  if (!layout.ok()) return layout;
  parallel_for(batch, RowCost(pieces, dim), [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(3 * dim);
    T* tmp = scratch.data();
    T* s = tmp + dim;
    T* q = s + dim;
    for (int64_t r = begin; r < end; ++r) {
      RowSums(groups, pieces, r, dim, tmp, s, q);
      T* o = out + r * dim;
      for (int64_t c = 0; c < dim; ++c) o[c] = s[c] * s[c] - q[c];
    }
  });
  return ImplStatus::Ok();
}

template <typename T, typename Idx>
ImplStatus BackwardFM(const std::vector<ConcatGroup<T, Idx>>& groups,
                      const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim,
                      const T* grad, const std::vector<T*>& d_rows,
                      const ParallelFor& parallel_for) {
  const ImplStatus layout = CheckFMLayout(groups, pieces, batch, dim);
  if (!layout.ok()) return layout;
  const int64_t width = static_cast<int64_t>(pieces.size()) * dim;  // checked above
  // The gradient of the stacked fields, [batch, width], in the concatenation's layout.
  std::unique_ptr<T[]> g_concat(new T[batch * width]);
  parallel_for(batch, SaturatingMul(RowCost(pieces, dim), 2), [&](int64_t begin, int64_t end) {
    std::vector<T> scratch(3 * dim);
    T* tmp = scratch.data();
    T* s = tmp + dim;
    T* two_s = s + dim;
    for (int64_t r = begin; r < end; ++r) {
      RowSums(groups, pieces, r, dim, tmp, s, static_cast<T*>(nullptr));
      const T* dy = grad + r * dim;
      for (int64_t c = 0; c < dim; ++c) two_s[c] = dy[c] * (s[c] * T(2));
      T* gr = g_concat.get() + r * width;
      for (const ConcatPiece<T>& piece : pieces) {
        const T* e = CombinedRow(groups[piece.group], piece, r, dim, tmp);
        T* out = gr + piece.column;
        for (int64_t c = 0; c < dim; ++c) {
          const T m = -dy[c] * e[c];
          out[c] = (two_s[c] + m) + m;
        }
      }
    }
  });
  std::vector<int64_t> num_unique(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) num_unique[g] = groups[g].num_rows;
  return BackwardConcat(groups, pieces, num_unique, batch, width, g_concat.get(),
                        /*broadcast=*/false, d_rows, parallel_for);
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                               \
  template ImplStatus CheckFMLayout<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,               \
                                            const std::vector<ConcatPiece<T>>&, int64_t, int64_t); \
  template ImplStatus ForwardFM<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,                   \
                                        const std::vector<ConcatPiece<T>>&, int64_t, int64_t, T*,  \
                                        const ParallelFor&);                                       \
  template ImplStatus BackwardFM<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,                  \
                                         const std::vector<ConcatPiece<T>>&, int64_t, int64_t,     \
                                         const T*, const std::vector<T*>&, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
