// CPU implementation of StitchConcat and its gradient: the fields of several
// packed tables (and dense matrices) combined straight into the columns of one
// concatenated matrix, and back. See stitch_concat_impl.h for the contract.
#include "kernels/stitch_concat/stitch_concat_impl.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/dispatch_dim.h"
#include "kernels/stitch_combine/stitch_rows.h"

namespace hybridtf {
namespace stitch_combine {

using rows::AddRow;
using rows::AddScalar;
using rows::CopyRow;
using rows::WriteRow;

namespace {

// A one-hot piece of a concatenation: row b reads rows[inverse[b]].
template <typename T, typename Idx>
struct OneHotPiece {
  const Idx* inverse;  // the field's positions (one per output row)
  const T* rows;
  int64_t column;
  bool prefetch;  // rows[] is bigger than a cache: fetch ahead
};

// The pieces of a concatenation sorted for tight loops: one-hot pieces by
// width (DispatchDim gives the common widths a compile-time loop), the rest
// (bags and dense pieces) generic.
template <typename T, typename Idx>
struct ConcatPlan {
  std::map<int64_t, std::vector<OneHotPiece<T, Idx>>> one_hot;  // by dim
  std::vector<const ConcatPiece<T>*> other;

  ConcatPlan(const std::vector<ConcatGroup<T, Idx>>& groups,
             const std::vector<ConcatPiece<T>>& pieces) {
    for (const auto& piece : pieces) {
      if (piece.group >= 0) {
        const ConcatGroup<T, Idx>& g = groups[piece.group];
        if (g.layout->combiner(piece.field) == Combiner::kNone) {
          int64_t pb = 0, pe = 0;
          g.layout->Positions(piece.field, g.layout->FirstRow(piece.field), &pb, &pe);
          const int64_t bytes = g.num_rows * g.dim * static_cast<int64_t>(sizeof(T));
          one_hot[g.dim].push_back(
              {g.inverse + pb, g.rows, piece.column, bytes > (int64_t{1} << 20)});
          continue;
        }
      }
      other.push_back(&piece);
    }
  }
};

constexpr int64_t kRowBlock = 32;  // output rows per block: a block of a wide concat stays in L2
constexpr int64_t kPrefetchRows = 4;
constexpr int64_t kTaskBytes = 512;

}  // namespace

template <typename T, typename Idx>
void ForwardConcat(const std::vector<ConcatGroup<T, Idx>>& groups,
                   const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t width, T* out,
                   const ParallelFor& parallel_for) {
  // Row-major in blocks of rows: every output row is written once, left to
  // right within each width class; reads of rows[] are the only random access.
  const ConcatPlan<T, Idx> plan(groups, pieces);
  const int64_t blocks = (batch + kRowBlock - 1) / kRowBlock;
  parallel_for(blocks, kRowBlock * width * 2, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t b0 = blk * kRowBlock, b1 = std::min(batch, b0 + kRowBlock);
      for (const auto& [dim, list] : plan.one_hot) {
        if (dim == 1) {  // scalar columns: column by column within the block (strided stores)
          for (const auto& p : list) {
            const Idx* inv = p.inverse;
            T* dst = out + p.column;
            for (int64_t b = b0; b < b1; ++b) dst[b * width] = p.rows[static_cast<int64_t>(inv[b])];
          }
          continue;
        }
        DispatchDim(dim, [&](auto w) {
          constexpr int D = decltype(w)::value;
          for (int64_t b = b0; b < b1; ++b) {
            T* row = out + b * width;
            for (const auto& p : list) {
              if (p.prefetch && b + kPrefetchRows < b1) {  // a row read a few output rows later
                __builtin_prefetch(p.rows +
                                   static_cast<int64_t>(p.inverse[b + kPrefetchRows]) * dim);
              }
              CopyRow<D>(row + p.column, p.rows + static_cast<int64_t>(p.inverse[b]) * dim, dim);
            }
          }
        });
      }
      for (const ConcatPiece<T>* piece : plan.other) {
        for (int64_t b = b0; b < b1; ++b) {
          T* dst = out + b * width + piece->column;
          if (piece->group < 0) {
            std::copy(piece->dense + b * piece->width, piece->dense + (b + 1) * piece->width, dst);
            continue;
          }
          const ConcatGroup<T, Idx>& g = groups[piece->group];
          int64_t pb = 0, pe = 0;
          g.layout->Positions(piece->field, g.layout->FirstRow(piece->field) + b, &pb, &pe);
          WriteRow<0>(g.layout->combiner(piece->field), g.rows, g.dim, g.inverse,
                      static_cast<const T*>(nullptr), pb, pe, dst);
        }
      }
    }
  });
}

template <typename T, typename Idx>
ImplStatus BackwardConcat(const std::vector<ConcatGroup<T, Idx>>& groups,
                          const std::vector<ConcatPiece<T>>& pieces,
                          const std::vector<int64_t>& num_unique, int64_t batch, int64_t width,
                          const T* grad, bool broadcast, const std::vector<T*>& d_rows,
                          const ParallelFor& parallel_for) {
  // Pieces whose rows can meet (overlapping ranges of distinct-row indices in
  // the same group: fields that look up the same table) form a cluster, and a
  // cluster is handled by one task, which walks the gradient row by row (then
  // piece by piece in column order). Each d_rows[u] is therefore summed in a
  // fixed order whatever the number of threads, every gradient entry is read
  // once, and a task reads the contiguous columns of its pieces in each row.
  // d_rows are zeroed by the task that sums into them (its cluster's rows are
  // then warm in that core's cache); rows no piece reaches are zeroed here.
  struct Item {
    const ConcatPiece<T>* piece;
    int64_t lo, hi;      // range of distinct-row indices the piece touches (lo > hi: none)
    int64_t first, end;  // positions
    int64_t cluster;
    bool one_hot;
  };
  std::vector<Item> items;
  for (const auto& piece : pieces) {
    if (piece.group < 0) continue;
    const ConcatGroup<T, Idx>& g = groups[piece.group];
    int64_t first = 0, last = 0, unused = 0;
    g.layout->Positions(piece.field, g.layout->FirstRow(piece.field), &first, &unused);
    if (batch > 0) {
      g.layout->Positions(piece.field, g.layout->FirstRow(piece.field) + batch - 1, &unused, &last);
    }
    items.push_back(Item{&piece, std::numeric_limits<int64_t>::max(), -1, first,
                         batch > 0 ? last : first, -1,
                         g.layout->combiner(piece.field) == Combiner::kNone});
  }
  parallel_for(static_cast<int64_t>(items.size()), 2 * batch, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      Item& item = items[k];
      const Idx* inverse = groups[item.piece->group].inverse;
      for (int64_t i = item.first; i < item.end; ++i) {
        const int64_t u = static_cast<int64_t>(inverse[i]);
        item.lo = std::min(item.lo, u);
        item.hi = std::max(item.hi, u);
      }
    }
  });
  // The ranges validate the inverse indices the pieces read (before any is used).
  for (const Item& item : items) {
    const ConcatGroup<T, Idx>& g = groups[item.piece->group];
    if (item.lo <= item.hi && (item.lo < 0 || item.hi >= num_unique[item.piece->group])) {
      ImplStatus bad = ValidateInverse(g.inverse, g.layout->num_positions(),
                                       num_unique[item.piece->group], parallel_for);
      if (bad.ok()) bad = ImplStatus::InvalidArgument("an inverse index is out of range");
      return bad;  // names the first bad position
    }
  }
  {
    std::vector<std::vector<std::pair<int64_t, int64_t>>> reached(groups.size());
    for (const Item& item : items) {
      if (item.lo <= item.hi) reached[item.piece->group].emplace_back(item.lo, item.hi);
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      std::sort(reached[g].begin(), reached[g].end());
      const int64_t dim = groups[g].dim;
      int64_t next = 0;  // rows below next are reached or zeroed
      for (const auto& [lo, hi] : reached[g]) {
        if (lo > next) std::fill(d_rows[g] + next * dim, d_rows[g] + lo * dim, T(0));
        next = std::max(next, hi + 1);
      }
      if (num_unique[g] > next) {
        std::fill(d_rows[g] + next * dim, d_rows[g] + num_unique[g] * dim, T(0));
      }
    }
  }
  // Clusters: sweep the pieces of each group by range start, merging overlaps.
  std::vector<size_t> by_range(items.size());
  for (size_t k = 0; k < items.size(); ++k) by_range[k] = k;
  std::sort(by_range.begin(), by_range.end(), [&](size_t a, size_t b) {
    const Item &x = items[a], &y = items[b];
    if (x.piece->group != y.piece->group) return x.piece->group < y.piece->group;
    return x.lo != y.lo ? x.lo < y.lo : a < b;
  });
  int64_t clusters = 0, reach = -1, group = -1;
  for (const size_t k : by_range) {
    Item& item = items[k];
    if (item.lo > item.hi) {  // touches no row: a cluster of its own
      item.cluster = clusters++;
      continue;
    }
    if (item.piece->group != group || item.lo > reach) {
      ++clusters;
      group = item.piece->group;
      reach = item.hi;
    } else {
      reach = std::max(reach, item.hi);
    }
    item.cluster = clusters - 1;
  }
  // Tasks: contiguous runs of clusters in column order (items are in column order).
  std::vector<int64_t> cluster_first_item(clusters, -1);
  std::vector<int64_t> order;  // clusters by their first column
  for (size_t k = 0; k < items.size(); ++k) {
    if (cluster_first_item[items[k].cluster] < 0) {
      cluster_first_item[items[k].cluster] = static_cast<int64_t>(k);
      order.push_back(items[k].cluster);
    }
  }
  // Every task walks all gradient rows, reading its columns of each: give a
  // task at least kTaskBytes of every row (so it reads long contiguous runs
  // and touches few pages per row, instead of one page per row for a few
  // columns), but make at least two tasks where there are two clusters.
  const int64_t task_columns = std::max<int64_t>(1, kTaskBytes / static_cast<int64_t>(sizeof(T)));
  const int64_t tasks =
      std::min<int64_t>({clusters, int64_t{64}, std::max<int64_t>(2, width / task_columns)});
  std::vector<int64_t> task_of_cluster(clusters, 0), cluster_size(clusters, 0);
  for (const Item& item : items) ++cluster_size[item.cluster];
  for (size_t i = 0; i < order.size(); ++i) {
    task_of_cluster[order[i]] =
        static_cast<int64_t>(i) * tasks / static_cast<int64_t>(order.size());
  }
  std::vector<std::vector<const Item*>> task_items(tasks);
  for (const Item& item : items) task_items[task_of_cluster[item.cluster]].push_back(&item);
  const int64_t per_task = tasks ? (batch * width) / tasks + 1 : 1;
  // Gradient rows a page or more apart defeat the hardware prefetcher.
  const bool prefetch_grad = !broadcast && width * static_cast<int64_t>(sizeof(T)) >= 4096;
  // The gradient of row b, column `column`: a run of the [batch, width] matrix,
  // or (broadcast) the one value grad[b] for every column.
  auto add_row = [&](auto d_tag, T* acc, int64_t b, int64_t column, int64_t dim) {
    constexpr int D = decltype(d_tag)::value;
    if (broadcast) {
      AddScalar<D>(acc, grad[b], dim);
    } else {
      AddRow<D>(acc, grad + b * width + column, dim);
    }
  };
  parallel_for(tasks, per_task, [&](int64_t first_task, int64_t end_task) {
    for (int64_t t = first_task; t < end_task; ++t) {
      const auto& mine = task_items[t];
      int64_t col_lo = width, col_hi = 0;  // the columns this task reads in every row
      int64_t footprint = 0;               // bytes of d_rows this task adds to
      for (const Item* item : mine) {
        col_lo = std::min(col_lo, item->piece->column);
        col_hi = std::max(col_hi, item->piece->column + item->piece->width);
        if (item->lo <= item->hi) {
          footprint += (item->hi - item->lo + 1) * groups[item->piece->group].dim *
                       static_cast<int64_t>(sizeof(T));
        }
      }
      for (const Item* item : mine) {  // all of them before any sum: items of a cluster overlap
        if (item->lo > item->hi) continue;
        const int64_t dim = groups[item->piece->group].dim;
        T* d = d_rows[item->piece->group];
        std::fill(d + item->lo * dim, d + (item->hi + 1) * dim, T(0));
      }
      // Prefetching the rows added to pays, except for narrow rows that stay in cache.
      const bool big_footprint = footprint > (int64_t{512} << 10);
      // Narrow one-hot pieces, none sharing rows with another piece: column by column.
      bool columnwise = true;
      for (const Item* item : mine) {
        columnwise &=
            item->one_hot && cluster_size[item->cluster] == 1 && groups[item->piece->group].dim < 8;
      }
      if (columnwise) {
        // Piece by piece within blocks of rows: each d_rows[u] still gets its
        // gradients in ascending row order, and the loops are tight.
        for (int64_t b0 = 0; b0 < batch; b0 += kRowBlock) {
          const int64_t b1 = std::min(batch, b0 + kRowBlock);
          for (const Item* item : mine) {
            const ConcatGroup<T, Idx>& g = groups[item->piece->group];
            T* d = d_rows[item->piece->group];
            const Idx* inv = g.inverse + item->first;
            const int64_t column = item->piece->column;
            DispatchDim(g.dim, [&](auto w) {
              for (int64_t b = b0; b < b1; ++b) {
                add_row(w, d + static_cast<int64_t>(inv[b]) * g.dim, b, column, g.dim);
              }
            });
          }
        }
        continue;
      }
      for (int64_t b = 0; b < batch; ++b) {
        const T* row = grad + (broadcast ? b : b * width);
        if (prefetch_grad && b + kPrefetchRows < batch) {
          const char* ahead = reinterpret_cast<const char*>(row + kPrefetchRows * width + col_lo);
          const char* ahead_end =
              reinterpret_cast<const char*>(row + kPrefetchRows * width + col_hi);
          for (; ahead < ahead_end; ahead += 64) __builtin_prefetch(ahead);
        }
        for (const Item* item : mine) {
          const ConcatPiece<T>& piece = *item->piece;
          const ConcatGroup<T, Idx>& g = groups[piece.group];
          T* d = d_rows[piece.group];
          const T* src = broadcast ? nullptr : row + piece.column;
          if (item->one_hot) {
            const Idx* inv = g.inverse + item->first;
            if ((big_footprint || g.dim >= 4) && b + kPrefetchRows < batch) {
              __builtin_prefetch(d + static_cast<int64_t>(inv[b + kPrefetchRows]) * g.dim, 1);
            }
            const int64_t u = static_cast<int64_t>(inv[b]);
            DispatchDim(g.dim, [&](auto w) { add_row(w, d + u * g.dim, b, piece.column, g.dim); });
            continue;
          }
          const Combiner combiner = g.layout->combiner(piece.field);
          int64_t pb = 0, pe = 0;
          g.layout->Positions(piece.field, g.layout->FirstRow(piece.field) + b, &pb, &pe);
          const T denom = Denominator(combiner, static_cast<const T*>(nullptr), pb, pe);
          if (denom == T(0)) continue;
          for (int64_t i = pb; i < pe; ++i) {
            T* acc = d + static_cast<int64_t>(g.inverse[i]) * g.dim;
            if (denom == T(1)) {
              add_row(std::integral_constant<int, 0>(), acc, b, piece.column, g.dim);
            } else {
              for (int64_t c = 0; c < g.dim; ++c) acc[c] += (broadcast ? grad[b] : src[c]) / denom;
            }
          }
        }
      }
    }
  });
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                            \
  template void ForwardConcat<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,                  \
                                      const std::vector<ConcatPiece<T>>&, int64_t, int64_t, T*, \
                                      const ParallelFor&);                                      \
  template ImplStatus BackwardConcat<T, Idx>(                                                   \
      const std::vector<ConcatGroup<T, Idx>>&, const std::vector<ConcatPiece<T>>&,              \
      const std::vector<int64_t>&, int64_t, int64_t, const T*, bool, const std::vector<T*>&,    \
      const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
