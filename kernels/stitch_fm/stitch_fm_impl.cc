// CPU implementation of StitchFM and its gradient. See stitch_fm_impl.h.
#include "kernels/stitch_fm/stitch_fm_impl.h"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/dispatch_dim.h"
#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace stitch_combine {

namespace {

// Always inlined into the HYBRIDTF_MULTIVERSION clones of their callers.
#define HYBRIDTF_ROW_INLINE inline __attribute__((always_inline))

// Rows of a batch chunk: the fields are read one after the other, each over
// the whole chunk (a field's distinct rows are one short range of the table,
// so it stays in cache), while the chunk's sums ([rows, dim], twice) stream.
constexpr int64_t kChunkRows = 2048;
// One-hot rows are fetched this many positions ahead (the table may not fit a cache).
constexpr int64_t kPrefetch = 16;

// Where every piece reads: its group, whether it is one-hot, and its first position.
struct PieceReader {
  int group;
  int field;
  bool one_hot;
  int64_t first;
};

template <typename T, typename Idx>
std::vector<PieceReader> Readers(const std::vector<ConcatGroup<T, Idx>>& groups,
                                 const std::vector<ConcatPiece<T>>& pieces) {
  std::vector<PieceReader> readers;
  for (const ConcatPiece<T>& piece : pieces) {
    const Layout& layout = *groups[piece.group].layout;
    int64_t b = 0, e = 0;
    layout.Positions(piece.field, layout.FirstRow(piece.field), &b, &e);
    readers.push_back(
        {piece.group, piece.field, layout.combiner(piece.field) == Combiner::kNone, b});
  }
  return readers;
}

// Field `reader`'s combined embedding of output row r: a pointer into rows for
// a one-hot field, else the bag combined into `tmp` (as StitchConcat writes it).
template <int D, typename T, typename Idx>
HYBRIDTF_ROW_INLINE const T* CombinedRow(const ConcatGroup<T, Idx>& g, const PieceReader& reader,
                                         int64_t r, int64_t dim, T* tmp) {
  const int64_t w = D > 0 ? D : dim;
  if (reader.one_hot) return g.rows + static_cast<int64_t>(g.inverse[reader.first + r]) * w;
  const Layout& layout = *g.layout;
  int64_t b = 0, e = 0;
  layout.Positions(reader.field, layout.FirstRow(reader.field) + r, &b, &e);
  const Combiner combiner = layout.combiner(reader.field);
  std::fill(tmp, tmp + w, T(0));
  const T denom = Denominator(combiner, static_cast<const T*>(nullptr), b, e);
  if (e == b || denom == T(0)) return tmp;
  for (int64_t i = b; i < e; ++i) {
    const T* src = g.rows + static_cast<int64_t>(g.inverse[i]) * w;
    for (int64_t c = 0; c < w; ++c) tmp[c] += src[c];
  }
  if (combiner != Combiner::kSum) {
    for (int64_t c = 0; c < w; ++c) tmp[c] /= denom;
  }
  return tmp;
}

// s[0:w] += e[0:w] and, with Squares, q[0:w] += e[0:w]^2 (restrict: vectorized, no reloads).
template <int D, bool Squares, typename T>
HYBRIDTF_ROW_INLINE void AddRow(int64_t dim, const T* __restrict e, T* __restrict s,
                                T* __restrict q) {
  const int64_t w = D > 0 ? D : dim;
  for (int64_t c = 0; c < w; ++c) s[c] += e[c];
  if constexpr (Squares) {
    for (int64_t c = 0; c < w; ++c) q[c] += e[c] * e[c];
  }
}

// o[0:w] = (t + m) + m with m = -dy * e: the gradient of e_f (restrict: vectorized).
template <int D, typename T>
HYBRIDTF_ROW_INLINE void GradRow(int64_t dim, const T* __restrict dy, const T* __restrict e,
                                 const T* __restrict t, T* __restrict o) {
  const int64_t w = D > 0 ? D : dim;
  for (int64_t c = 0; c < w; ++c) {
    const T m = -dy[c] * e[c];
    o[c] = (t[c] + m) + m;
  }
}

// For rows [r0, r1): s[r - r0] = sum over the pieces (in order) of row r's
// embeddings and, with Squares, q[r - r0] = the sum of their squares.
template <int D, bool Squares, typename T, typename Idx>
HYBRIDTF_ROW_INLINE void ChunkSums(const std::vector<ConcatGroup<T, Idx>>& groups,
                                   const std::vector<PieceReader>& readers, int64_t r0, int64_t r1,
                                   int64_t dim, T* tmp, T* s, T* q) {
  const int64_t w = D > 0 ? D : dim;
  std::fill(s, s + (r1 - r0) * w, T(0));
  if constexpr (Squares) std::fill(q, q + (r1 - r0) * w, T(0));
  for (const PieceReader& reader : readers) {
    const ConcatGroup<T, Idx>& g = groups[reader.group];
    if (reader.one_hot) {
      const Idx* inv = g.inverse + reader.first;
      const T* rows = g.rows;
      for (int64_t r = r0; r < r1; ++r) {
        if (r + kPrefetch < r1)
          __builtin_prefetch(rows + static_cast<int64_t>(inv[r + kPrefetch]) * w);
        AddRow<D, Squares>(dim, rows + static_cast<int64_t>(inv[r]) * w, s + (r - r0) * w,
                           Squares ? q + (r - r0) * w : nullptr);
      }
      continue;
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* e = CombinedRow<D>(g, reader, r, dim, tmp);
      AddRow<D, Squares>(dim, e, s + (r - r0) * w, Squares ? q + (r - r0) * w : nullptr);
    }
  }
}

template <int D, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void ForwardRows(const std::vector<ConcatGroup<T, Idx>>& groups,
                                       const std::vector<PieceReader>& readers, int64_t begin,
                                       int64_t end, int64_t dim, T* out, T* sums) {
  const int64_t w = D > 0 ? D : dim;
  std::vector<T> scratch((kChunkRows + 1) * w);
  T* tmp = scratch.data();
  T* q = tmp + w;
  for (int64_t r0 = begin; r0 < end; r0 += kChunkRows) {
    const int64_t r1 = std::min(end, r0 + kChunkRows);
    T* s = sums + r0 * w;
    ChunkSums<D, true>(groups, readers, r0, r1, dim, tmp, s, q);
    T* o = out + r0 * w;
    for (int64_t i = 0; i < (r1 - r0) * w; ++i) o[i] = s[i] * s[i] - q[i];
  }
}

// Rows [begin, end) of the stacked fields' gradient g_concat ([batch, width]).
template <int D, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void GradientRows(const std::vector<ConcatGroup<T, Idx>>& groups,
                                        const std::vector<ConcatPiece<T>>& pieces,
                                        const std::vector<PieceReader>& readers, int64_t begin,
                                        int64_t end, int64_t dim, int64_t width, const T* grad,
                                        const T* two_s, T* g_concat) {
  const int64_t w = D > 0 ? D : dim;
  std::vector<T> tmp(w);
  for (size_t k = 0; k < readers.size(); ++k) {
    const ConcatGroup<T, Idx>& g = groups[readers[k].group];
    for (int64_t r = begin; r < end; ++r) {
      const T* e = CombinedRow<D>(g, readers[k], r, dim, tmp.data());
      GradRow<D>(dim, grad + r * w, e, two_s + r * w, g_concat + r * width + pieces[k].column);
    }
  }
}

// two_s[i] = dy[i] * (2 S[i]) + d_sums[i] over rows [begin, end) (d_sums, the
// gradient of the sums output, reaches every field; zero when only the cross
// term is used, and x + 0 == x).
template <typename T>
HYBRIDTF_MULTIVERSION void TwoSumRows(int64_t begin, int64_t end, int64_t dim, const T* grad,
                                      const T* sums, const T* d_sums, T* two_s) {
  for (int64_t i = begin * dim; i < end * dim; ++i) {
    two_s[i] = grad[i] * (sums[i] * T(2)) + d_sums[i];
  }
}

// d_rows[inverse[i]] += the gradient of one-hot field `reader` at each of its
// positions i, in ascending position order (d_rows zeroed by the caller).
template <int D, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void ScatterField(const ConcatGroup<T, Idx>& g, const PieceReader& reader,
                                        int64_t batch, int64_t dim, const T* grad, const T* two_s,
                                        T* d_rows) {
  const int64_t w = D > 0 ? D : dim;
  std::vector<T> t(w);
  const Idx* inv = g.inverse + reader.first;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t u = static_cast<int64_t>(inv[r]);
    GradRow<D>(dim, grad + r * w, g.rows + u * w, two_s + r * w, t.data());
    T* d = d_rows + u * w;
    for (int64_t c = 0; c < w; ++c) d[c] += t[c];
  }
}

// True when every piece is a one-hot field and no two pieces of a group read
// overlapping ranges of distinct rows (a packed chain with sorted unique ids):
// then each distinct row is summed by one field, in ascending position order,
// as BackwardConcat sums it, and the fields can be scattered in parallel.
template <typename T, typename Idx>
bool DisjointOneHot(const std::vector<ConcatGroup<T, Idx>>& groups,
                    const std::vector<PieceReader>& readers, int64_t batch) {
  std::vector<std::tuple<int, int64_t, int64_t>> ranges;  // group, lo, hi
  for (const PieceReader& reader : readers) {
    if (!reader.one_hot) return false;
    if (batch == 0) continue;
    const Idx* inv = groups[reader.group].inverse + reader.first;
    Idx lo = inv[0], hi = inv[0];
    for (int64_t r = 1; r < batch; ++r) {
      lo = std::min(lo, inv[r]);
      hi = std::max(hi, inv[r]);
    }
    ranges.emplace_back(reader.group, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    if (std::get<0>(ranges[k]) == std::get<0>(ranges[k - 1]) &&
        std::get<1>(ranges[k]) <= std::get<2>(ranges[k - 1])) {
      return false;
    }
  }
  return true;
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
                     T* sums, const ParallelFor& parallel_for) {
  const ImplStatus layout = CheckFMLayout(groups, pieces, batch, dim);
  if (!layout.ok()) return layout;
  const std::vector<PieceReader> readers = Readers(groups, pieces);
  parallel_for(batch, RowCost(pieces, dim), [&](int64_t begin, int64_t end) {
    DispatchDim(dim, [&](auto d) {
      ForwardRows<decltype(d)::value>(groups, readers, begin, end, dim, out, sums);
    });
  });
  return ImplStatus::Ok();
}

template <typename T, typename Idx>
ImplStatus BackwardFM(const std::vector<ConcatGroup<T, Idx>>& groups,
                      const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t dim,
                      const T* grad, const T* sums, const T* d_sums, const std::vector<T*>& d_rows,
                      const ParallelFor& parallel_for) {
  const ImplStatus layout = CheckFMLayout(groups, pieces, batch, dim);
  if (!layout.ok()) return layout;
  const int64_t width = static_cast<int64_t>(pieces.size()) * dim;  // checked above
  const std::vector<PieceReader> readers = Readers(groups, pieces);
  // dy * (2 S) + d_sums per row, from the forward's S.
  std::unique_ptr<T[]> two_s(new T[batch * dim]);
  parallel_for(batch, SaturatingMul(dim, 2), [&](int64_t begin, int64_t end) {
    TwoSumRows(begin, end, dim, grad, sums, d_sums, two_s.get());
  });
  if (DisjointOneHot(groups, readers, batch)) {
    // Straight into d_rows: one task per field.
    for (size_t g = 0; g < groups.size(); ++g) {
      std::fill(d_rows[g], d_rows[g] + groups[g].num_rows * dim, T(0));
    }
    parallel_for(static_cast<int64_t>(readers.size()), SaturatingMul(batch, 4 * dim),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t k = begin; k < end; ++k) {
                     const ConcatGroup<T, Idx>& g = groups[readers[k].group];
                     DispatchDim(dim, [&](auto d) {
                       ScatterField<decltype(d)::value>(g, readers[k], batch, dim, grad,
                                                        two_s.get(), d_rows[readers[k].group]);
                     });
                   }
                 });
    return ImplStatus::Ok();
  }
  // Bags or shared rows: the gradient of the stacked fields, [batch, width], in
  // the concatenation's layout, summed per distinct row by BackwardConcat.
  std::unique_ptr<T[]> g_concat(new T[batch * width]);
  parallel_for(batch, RowCost(pieces, dim), [&](int64_t begin, int64_t end) {
    DispatchDim(dim, [&](auto d) {
      GradientRows<decltype(d)::value>(groups, pieces, readers, begin, end, dim, width, grad,
                                       two_s.get(), g_concat.get());
    });
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
                                        T*, const ParallelFor&);                                   \
  template ImplStatus BackwardFM<T, Idx>(                                                          \
      const std::vector<ConcatGroup<T, Idx>>&, const std::vector<ConcatPiece<T>>&, int64_t,        \
      int64_t, const T*, const T*, const T*, const std::vector<T*>&, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE
#undef HYBRIDTF_ROW_INLINE

}  // namespace stitch_combine
}  // namespace hybridtf
