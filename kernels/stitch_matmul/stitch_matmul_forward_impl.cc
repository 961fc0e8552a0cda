// CPU implementation of StitchConcatMatMul's forward (the gradient is in
// stitch_matmul_impl.cc). See stitch_matmul_impl.h for the contract.
//
// The pieces are taken in order, in at most kMaxChunks chunks fixed by the
// layout (chunk 0 adds into the output, a later chunk into one partial output
// that is then added to it), and within a chunk in "sweeps": runs of one-hot
// projected fields whose projections of one column slice (kSlice columns) fit
// kSweepSliceBytes. A sweep first projects its fields' distinct rows (P_f[u] =
// rows[u] @ K_f; blocks of rows spread over the threads, four rows by sixteen
// columns at a time in registers), then adds, per column slice and tile of
// batch rows, every field's projection slice P_f[inverse[b]] into the output
// slice held in registers. The [batch, units] output thus crosses the memory
// hierarchy once per sweep instead of once per field, and the projections are
// read while they are still in L2. Bags, pooled fields and dense inputs are
// sweeps of their own, row by row.
//
// Every output value is summed as the op always has: its pieces' contributions
// in piece order from zero within a chunk, the chunks in order; every
// projection value over the piece's columns in order (ProjectAdd's interleaved
// sums for units 8, 16 and 32). So the result does not depend on the threads
// and equals the earlier one-pass-per-field implementation bit for bit.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/dispatch_dim.h"
#include "kernels/common/multiversion.h"
#include "kernels/stitch_matmul/stitch_matmul_impl.h"
#include "kernels/stitch_matmul/stitch_matmul_jobs.h"
#include "kernels/stitch_matmul/stitch_matmul_rows.h"

namespace hybridtf {
namespace stitch_combine {

namespace {

using matmul_jobs::CheckRanges;
using matmul_jobs::Job;
using matmul_jobs::MakeJobs;
using matmul_jobs::PoolRow;
using matmul_jobs::RowPositions;
using matmul_rows::AddRow;
using matmul_rows::ProjectAdd;
using matmul_rows::ProjectRange;

// The columns are taken in slices of kSlice; a sweep of one-hot fields holds
// each field's projections slice by slice ([slice][distinct row][kSlice]), and
// its fields' projections of one slice take at most kSweepSliceBytes (one
// field alone may take more): every thread reads them at random for its batch
// rows, so they should stay in its L2 cache.
#ifndef HYBRIDTF_SWEEP_BYTES
#define HYBRIDTF_SWEEP_BYTES (int64_t{512} << 10)
#endif
constexpr int64_t kSweepSliceBytes = HYBRIDTF_SWEEP_BYTES;
constexpr int64_t kSlice = 64;
// At most this many fields per sweep (bounds the per-row bookkeeping).
constexpr int64_t kMaxSweepFields = 64;
// Distinct rows per projection task, batch rows per output task.
constexpr int64_t kProjectRows = 64;
constexpr int64_t kTileRows = 64;

// y_r += row r of a piece that is not a one-hot projected field: a dense
// input, a projected bag (its positions' projections, combined), or a pooled
// field (the row combined as StitchConcat writes it, then multiplied).
// tmp holds n + dim values.
template <int U, typename T, typename Idx>
HYBRIDTF_ROW_INLINE void AddPieceRow(const std::vector<ConcatGroup<T, Idx>>& groups,
                                     const ConcatPiece<T>& piece, const Job& job, const T* proj,
                                     const T* kernel, int64_t n, int64_t r, T* tmp,
                                     T* __restrict yr) {
  const T* kb = kernel + piece.column * n;
  if (job.group < 0) {
    ProjectAdd<U>(piece.dense + r * piece.width, piece.width, kb, n, yr);
    return;
  }
  const ConcatGroup<T, Idx>& g = groups[job.group];
  const int64_t dim = g.dim;
  const Combiner combiner = g.layout->combiner(job.field);
  int64_t b = 0, e = 0;
  T denom = T(1);
  if (!RowPositions(g, job, r, &b, &e, &denom)) return;
  if (job.project) {  // a bag: the sum of its positions' projections, then combined
    std::fill(tmp, tmp + n, T(0));
    for (int64_t i = b; i < e; ++i) {
      AddRow<U>(tmp, proj + (static_cast<int64_t>(g.inverse[i]) - job.lo) * n, n);
    }
    if (combiner != Combiner::kSum) {
      for (int64_t j = 0; j < n; ++j) tmp[j] /= denom;
    }
    AddRow<U>(yr, tmp, n);
    return;
  }
  if (combiner == Combiner::kNone) {  // pooled one-hot: the row itself
    ProjectAdd<U>(g.rows + static_cast<int64_t>(g.inverse[b]) * dim, dim, kb, n, yr);
    return;
  }
  T* pooled = tmp + n;
  PoolRow(g, b, e, denom, combiner != Combiner::kSum, pooled);
  ProjectAdd<U>(pooled, dim, kb, n, yr);
}

// y_r += row r of piece k, for the output rows [r0, r1).
template <int U, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void PieceRows(const std::vector<ConcatGroup<T, Idx>>& groups,
                                     const ConcatPiece<T>& piece, const Job& job, const T* proj,
                                     const T* kernel, int64_t n, int64_t r0, int64_t r1, T* tmp,
                                     T* y) {
  for (int64_t r = r0; r < r1; ++r) {
    AddPieceRow<U>(groups, piece, job, proj, kernel, n, r, tmp, y + r * n);
  }
}

// y[r, column, + w) += the sweep's m projection rows of output row r, in
// field order, for the output rows [r0, r1) (one column slice).
template <int kW, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void SliceRows(int64_t w, int64_t m, const T* const* base,
                                     const Idx* const* idx, const int64_t* lo, int64_t r0,
                                     int64_t r1, int64_t n, int64_t column, T* y) {
  for (int64_t r = r0; r < r1; ++r) {
    matmul_rows::AddSliceRows<kW>(y + r * n + column, w, m, base, idx, lo, r, kSlice);
  }
}

// p[(u - lo) * ps + j] = rows[u] @ kb[:, j] for u in [lo, hi), j < cols.
template <int D, typename T>
HYBRIDTF_MULTIVERSION void ProjectRows(const T* rows, int64_t dim, int64_t lo, int64_t hi,
                                       const T* kb, int64_t n, int64_t cols, T* p, int64_t ps) {
  ProjectRange<D>(rows, dim, lo, hi, kb, n, cols, p, ps);
}

// The same for units == U of 8, 16 or 32: ProjectAdd's interleaved sums (as
// the fused dense layer of small models has always rounded).
template <int U, typename T>
HYBRIDTF_MULTIVERSION void ProjectRowsNarrow(const T* rows, int64_t dim, int64_t lo, int64_t hi,
                                             const T* kb, int64_t n, T* p, int64_t ps) {
  for (int64_t u = lo; u < hi; ++u) {
    ProjectAdd<U, T, false>(rows + u * dim, dim, kb, n, p + (u - lo) * ps);
  }
}

// Forward, the pieces are summed in at most this many chunks, fixed by the
// layout and not by the threads (chunk c > 0 into a partial output, added to
// the output in chunk order): the summation order the op has always had.
constexpr int64_t kMaxChunks = 8;

// Splits jobs [0, size) into at most kMaxChunks runs of about equal cost.
std::vector<int64_t> ChunkBounds(const std::vector<Job>& jobs) {
  // Costs are estimates that may saturate: summed in double (exact below
  // 2^53, deterministic above), so the split never overflows.
  double total = 0;
  for (const Job& job : jobs) total += static_cast<double>(std::max<int64_t>(job.cost, 1));
  const int64_t chunks = std::min<int64_t>(kMaxChunks, static_cast<int64_t>(jobs.size()));
  std::vector<int64_t> bounds(1, 0);
  double acc = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    acc += static_cast<double>(std::max<int64_t>(jobs[k].cost, 1));
    const int64_t next = static_cast<int64_t>(bounds.size());
    if (next < chunks && acc * static_cast<double>(chunks) >= total * static_cast<double>(next))
      bounds.push_back(static_cast<int64_t>(k) + 1);
  }
  if (bounds.back() != static_cast<int64_t>(jobs.size())) {
    bounds.push_back(static_cast<int64_t>(jobs.size()));
  }
  return bounds;
}

// A block of distinct rows [lo, hi) of piece k to project.
struct ProjectTask {
  int64_t k, lo, hi;
};

// Projects the tasks' rows: piece k's block goes to proj + offsets[k - first],
// one region of (hi - lo) * slice values per column slice of `slice` columns.
template <typename T, typename Idx>
void ProjectTasks(const std::vector<ConcatGroup<T, Idx>>& groups,
                  const std::vector<ConcatPiece<T>>& pieces, const std::vector<Job>& jobs,
                  const std::vector<ProjectTask>& tasks, const std::vector<int64_t>& offsets,
                  int64_t first, const T* kernel, int64_t n, int64_t slice, T* proj,
                  const ParallelFor& parallel_for) {
  if (tasks.empty()) return;
  const int64_t dim0 = groups[jobs[tasks[0].k].group].dim;
  parallel_for(static_cast<int64_t>(tasks.size()), kProjectRows * dim0 * n,
               [&](int64_t begin, int64_t end) {
                 for (int64_t t = begin; t < end; ++t) {
                   const ProjectTask& task = tasks[t];
                   const Job& job = jobs[task.k];
                   const ConcatGroup<T, Idx>& g = groups[job.group];
                   const int64_t range = job.hi - job.lo;
                   T* dst = proj + offsets[task.k - first] + (task.lo - job.lo) * slice;
                   if (n == 8 || n == 16 || n == 32) {  // one slice (kSlice >= 32)
                     DispatchDim(n, [&](auto u) {
                       ProjectRowsNarrow<decltype(u)::value>(g.rows, g.dim, task.lo, task.hi,
                                                             kernel + pieces[task.k].column * n, n,
                                                             dst, slice);
                     });
                     continue;
                   }
                   DispatchDim(g.dim, [&](auto d) {
                     for (int64_t c = 0; c < n; c += slice) {
                       ProjectRows<decltype(d)::value>(
                           g.rows, g.dim, task.lo, task.hi, kernel + pieces[task.k].column * n + c,
                           n, std::min(slice, n - c), dst + (c / slice) * range * slice, slice);
                     }
                   });
                 }
               });
}

}  // namespace

template <typename T, typename Idx>
ImplStatus ForwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                               const std::vector<ConcatPiece<T>>& pieces, int64_t batch,
                               const T* kernel, int64_t units, T* out,
                               const ParallelFor& parallel_for) {
  if (pieces.empty() || batch == 0 || units == 0) {
    std::fill(out, out + batch * units, T(0));
    return ImplStatus::Ok();
  }
  const std::vector<Job> jobs = MakeJobs(groups, pieces, batch, units, parallel_for);
  const ImplStatus ranges = CheckRanges(groups, jobs);
  if (!ranges.ok()) return ranges;
  const int64_t n = units;
  parallel_for(batch, n, [&](int64_t begin, int64_t end) {
    std::fill(out + begin * n, out + end * n, T(0));
  });
  auto one_hot_projected = [&](const Job& job) {
    return job.project && groups[job.group].layout->combiner(job.field) == Combiner::kNone;
  };
  const int64_t budget = kSweepSliceBytes / static_cast<int64_t>(sizeof(T));
  const int64_t num_slices = (n + kSlice - 1) / kSlice;
  const int64_t tiles = (batch + kTileRows - 1) / kTileRows;
  std::vector<T> proj;
  std::vector<ProjectTask> tasks;
  std::vector<int64_t> offsets;
  // Chunks of pieces (ChunkBounds): chunk 0 adds into out, a later one into
  // `partial`, then added to out in chunk order.
  const std::vector<int64_t> bounds = ChunkBounds(jobs);
  std::unique_ptr<T[]> partial(bounds.size() > 2 ? new T[batch * n] : nullptr);
  for (size_t chunk = 0; chunk + 1 < bounds.size(); ++chunk) {
    T* y = chunk == 0 ? out : partial.get();
    if (chunk > 0) {
      parallel_for(batch, n, [&](int64_t begin, int64_t end) {
        std::fill(y + begin * n, y + end * n, T(0));
      });
    }
    const int64_t num_jobs = bounds[chunk + 1];
    for (int64_t first = bounds[chunk]; first < num_jobs;) {
      tasks.clear();
      offsets.clear();
      const Job& head = jobs[first];
      if (!one_hot_projected(head)) {
        // A sweep of its own, row by row: a dense input, a bag or a pooled field.
        const int64_t dim = head.group >= 0 ? groups[head.group].dim : 0;
        if (head.project) {
          proj.resize((head.hi - head.lo) * n);
          offsets.push_back(0);
          for (int64_t u = head.lo; u < head.hi; u += kProjectRows) {
            tasks.push_back({first, u, std::min(head.hi, u + kProjectRows)});
          }
          ProjectTasks(groups, pieces, jobs, tasks, offsets, first, kernel, n, n, proj.data(),
                       parallel_for);
        }
        parallel_for(
            tiles, std::max<int64_t>(1, head.cost / tiles), [&](int64_t begin, int64_t end) {
              std::vector<T> tmp(n + dim);
              DispatchDim(n, [&](auto u) {
                PieceRows<decltype(u)::value>(groups, pieces[first], head, proj.data(), kernel, n,
                                              begin * kTileRows, std::min(batch, end * kTileRows),
                                              tmp.data(), y);
              });
            });
        ++first;
        continue;
      }
      // A sweep of one-hot projected fields [first, last): their projections of
      // one column slice fit the budget.
      int64_t last = first, values = 0, total = 0;
      while (last < num_jobs && last - first < kMaxSweepFields && one_hot_projected(jobs[last])) {
        const int64_t range = jobs[last].hi - jobs[last].lo;
        if (last > first && values + range * kSlice > budget) break;
        values += range * kSlice;
        offsets.push_back(total);
        total += range * kSlice * num_slices;
        for (int64_t u = jobs[last].lo; u < jobs[last].hi; u += kProjectRows) {
          tasks.push_back({last, u, std::min(jobs[last].hi, u + kProjectRows)});
        }
        ++last;
      }
      proj.resize(total);  // the slices' padding columns are never read
      ProjectTasks(groups, pieces, jobs, tasks, offsets, first, kernel, n, kSlice, proj.data(),
                   parallel_for);
      const int64_t m = last - first;
      std::vector<const T*> base(num_slices * m);
      std::vector<const Idx*> idx(m);
      std::vector<int64_t> lo(m);
      for (int64_t i = 0; i < m; ++i) {
        const Job& job = jobs[first + i];
        idx[i] = groups[job.group].inverse + job.pb;
        lo[i] = job.lo;
        for (int64_t c = 0; c < num_slices; ++c) {
          base[c * m + i] = proj.data() + offsets[i] + c * (job.hi - job.lo) * kSlice;
        }
      }
      // Slice-major tasks: each thread reads a few slices' projections.
      parallel_for(num_slices * tiles, kTileRows * m * kSlice, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t c = t / tiles, r0 = (t % tiles) * kTileRows;
          const int64_t w = std::min(kSlice, n - c * kSlice), r1 = std::min(batch, r0 + kTileRows);
          if (w == kSlice) {
            SliceRows<kSlice>(w, m, base.data() + c * m, idx.data(), lo.data(), r0, r1, n,
                              c * kSlice, y);
          } else {
            SliceRows<0>(w, m, base.data() + c * m, idx.data(), lo.data(), r0, r1, n, c * kSlice,
                         y);
          }
        }
      });
      first = last;
    }
    if (chunk > 0) {
      parallel_for(batch, n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin * n; i < end * n; ++i) out[i] += y[i];
      });
    }
  }
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                           \
  template ImplStatus ForwardConcatMatMul<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,     \
                                                  const std::vector<ConcatPiece<T>>&, int64_t, \
                                                  const T*, int64_t, T*, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
