// CPU implementation of StitchConcatMatMul's gradient (the forward is in
// stitch_matmul_forward_impl.cc). See stitch_matmul_impl.h for the contract.
#include "kernels/stitch_matmul/stitch_matmul_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/common/checked_math.h"
#include "kernels/common/dispatch_dim.h"
#include "kernels/common/multiversion.h"
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
using matmul_rows::AxpyRow;
using matmul_rows::AxpyRows4;
using matmul_rows::ProjectAdd;
using matmul_rows::ProjectRows4;

// Kernel block of a piece transposed: kt[j * w + c] = kernel[column + c, j].
template <typename T>
void TransposeBlock(const T* kernel, int64_t column, int64_t w, int64_t n, std::vector<T>* kt) {
  kt->resize(w * n);
  for (int64_t c = 0; c < w; ++c) {
    for (int64_t j = 0; j < n; ++j) (*kt)[j * w + c] = kernel[(column + c) * n + j];
  }
}

// Per-thread scratch buffers of the gradient tasks.
template <typename T>
struct Scratch {
  std::vector<T> kt;  // the job's kernel block, transposed
  std::vector<T> values;
  std::vector<T> sums;          // projected fields: per distinct row, its summed gradient row
  std::vector<char> touched;    // per distinct row: read by some position
  std::vector<int64_t> row_of;  // bags: position -> output row
  std::vector<T> denom;         // bags: output row -> combiner denominator
};

// Gradient of a projected field: per distinct row u, S[u] = sum of the
// (combiner-scaled) gradient rows of the positions that read u, in ascending
// position order (the positions are visited in order and each adds its
// gradient row into its row's S, a buffer of the field's distinct-row range
// that stays in cache while the gradient is read front to back); then
// d_rows[u] += S[u] @ K_f^T and dK_f += rows[u]^T S[u].
template <int D, typename T, typename Idx>
HYBRIDTF_ROW_INLINE void BackwardProjected(const ConcatGroup<T, Idx>& g, const Job& job,
                                           const T* kt, int64_t n, int64_t batch, const T* grad,
                                           bool divide, int64_t width, T* d_rows, T* dk,
                                           Scratch<T>* scratch) {
  const int64_t w = D > 0 ? D : width;
  const int64_t range = job.hi - job.lo, positions = job.pe - job.pb;
  const Idx* inv = g.inverse + job.pb;
  const bool one_hot = g.layout->combiner(job.field) == Combiner::kNone;
  if (!one_hot) {
    scratch->row_of.resize(positions);
    scratch->denom.resize(batch);
    for (int64_t r = 0; r < batch; ++r) {
      int64_t b = 0, e = 0;
      T denom = T(1);
      if (!RowPositions(g, job, r, &b, &e, &denom)) continue;
      scratch->denom[r] = denom;
      for (int64_t i = b; i < e; ++i) scratch->row_of[i - job.pb] = r;
    }
  }
  // S[u] starts as its first position's gradient row (0 + x == x), the others add.
  scratch->sums.resize(range * n);
  scratch->touched.assign(range, 0);
  T* sums = scratch->sums.data();
  char* touched = scratch->touched.data();
  for (int64_t i = 0; i < positions; ++i) {
    const int64_t u = static_cast<int64_t>(inv[i]) - job.lo;
    const int64_t r = one_hot ? i : scratch->row_of[i];
    const T* gr = grad + r * n;
    T* acc = sums + u * n;
    if (divide) {
      const T denom = scratch->denom[r];
      if (touched[u]) {
        for (int64_t j = 0; j < n; ++j) acc[j] += gr[j] / denom;
      } else {
        for (int64_t j = 0; j < n; ++j) acc[j] = gr[j] / denom;
      }
    } else if (touched[u]) {
      AddRow<0>(acc, gr, n);
    } else {
      std::memcpy(acc, gr, sizeof(T) * n);
    }
    touched[u] = 1;
  }
  // dK_f += rows[u]^T S[u] four distinct rows at a time (one pass over dK_f's rows each)
  constexpr int kBlock = 4;
  int64_t block_rows[kBlock];
  int filled = 0;
  auto flush = [&]() HYBRIDTF_LAMBDA_INLINE {
    const T* s[kBlock];
    for (int b = 0; b < filled; ++b) s[b] = sums + (block_rows[b] - job.lo) * n;
    // d_rows[row] += S[u] @ K_f^T
    constexpr bool kFour = (D == 8 || D == 16) && std::is_same<T, float>::value;
    if (kFour && filled == kBlock) {
      if constexpr (kFour) {
        float* d[kBlock];
        for (int b = 0; b < kBlock; ++b) d[b] = d_rows + block_rows[b] * w;
        ProjectRows4<D>(s, n, kt, d);
      }
    } else {
      for (int b = 0; b < filled; ++b) ProjectAdd<D>(s[b], n, kt, w, d_rows + block_rows[b] * w);
    }
    if (filled == kBlock) {
      const T* r0 = g.rows + block_rows[0] * w;
      const T* r1 = g.rows + block_rows[1] * w;
      const T* r2 = g.rows + block_rows[2] * w;
      const T* r3 = g.rows + block_rows[3] * w;
      for (int64_t c = 0; c < width; ++c) {
        AxpyRows4(dk + c * n, r0[c], r1[c], r2[c], r3[c], s[0], s[1], s[2], s[3], n);
      }
    } else {
      for (int b = 0; b < filled; ++b) {
        const T* values = g.rows + block_rows[b] * w;
        for (int64_t c = 0; c < width; ++c) AxpyRow<0>(dk + c * n, values[c], s[b], n);
      }
    }
    filled = 0;
  };
  for (int64_t u = 0; u < range; ++u) {
    if (!touched[u]) continue;
    block_rows[filled++] = job.lo + u;
    if (filled == kBlock) flush();
  }
  flush();
}

// Gradient of one job: its kernel rows (overwritten), d_rows of the rows it
// reads (added to; zeroed by the caller) or its dense input (overwritten).
// D is the piece's width when > 0 (the short loops); units are long loops.
template <int D, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void BackwardJob(const std::vector<ConcatGroup<T, Idx>>& groups,
                                       const ConcatPiece<T>& piece, const Job& job, const T* kernel,
                                       int64_t n, int64_t batch, const T* grad, T* d_rows,
                                       T* d_piece, T* d_kernel, Scratch<T>* scratch) {
  // width at run time for the kernel-gradient loops (long rows of n values each;
  // a compile-time width there makes GCC vectorize across rows, with shuffles)
  const int64_t width = job.group < 0 ? piece.width : groups[job.group].dim;
  const int64_t w = D > 0 ? D : width;
  T* dk = d_kernel + piece.column * n;
  std::fill(dk, dk + w * n, T(0));
  TransposeBlock(kernel, piece.column, w, n, &scratch->kt);
  const T* kt = scratch->kt.data();
  if (job.group < 0) {
    for (int64_t b = 0; b < batch; ++b) {
      const T* gb = grad + b * n;
      T* out = d_piece + b * w;
      std::fill(out, out + w, T(0));
      ProjectAdd<D>(gb, n, kt, w, out);
      const T* db = piece.dense + b * w;
      for (int64_t c = 0; c < width; ++c) AxpyRow<0>(dk + c * n, db[c], gb, n);
    }
    return;
  }
  const ConcatGroup<T, Idx>& g = groups[job.group];
  const bool one_hot = g.layout->combiner(job.field) == Combiner::kNone;
  const bool sum = g.layout->combiner(job.field) == Combiner::kSum;
  const bool divide = !one_hot && !sum;
  if (job.project) {
    BackwardProjected<D>(g, job, kt, n, batch, grad, divide, width, d_rows, dk, scratch);
    return;
  }
  scratch->values.assign(2 * w, T(0));
  T* t = scratch->values.data();  // the row's gradient times the kernel block's transpose
  T* pooled = t + w;              // the combined row
  for (int64_t r = 0; r < batch; ++r) {
    int64_t b = 0, e = 0;
    T denom = T(1);
    if (!RowPositions(g, job, r, &b, &e, &denom)) continue;
    const T* gr = grad + r * n;
    // d kernel += combined row (as forward) x gradient row; each position's
    // distinct row gets the gradient row times the kernel block's transpose, combined
    const T* row = g.rows + static_cast<int64_t>(g.inverse[b]) * w;
    if (!one_hot) {
      PoolRow(g, b, e, denom, divide, pooled);
      row = pooled;
    }
    for (int64_t c = 0; c < width; ++c) AxpyRow<0>(dk + c * n, row[c], gr, n);
    std::fill(t, t + w, T(0));
    ProjectAdd<D>(gr, n, kt, w, t);
    if (divide) {
      for (int64_t c = 0; c < w; ++c) t[c] /= denom;
    }
    for (int64_t i = b; i < e; ++i) {
      T* du = d_rows + static_cast<int64_t>(g.inverse[i]) * w;
      for (int64_t c = 0; c < w; ++c) du[c] += t[c];
    }
  }
}

// One task: zeroes the d_rows rows it owns, then runs its jobs in piece order.
template <typename T, typename Idx>
void RunTask(const std::vector<ConcatGroup<T, Idx>>& groups,
             const std::vector<ConcatPiece<T>>& pieces, const std::vector<Job>& jobs,
             const std::vector<int64_t>& task, std::pair<int64_t, int64_t> rows, const T* kernel,
             int64_t units, int64_t batch, const T* grad, const std::vector<T*>& d_rows,
             const std::vector<T*>& d_pieces, T* d_kernel, Scratch<T>* scratch) {
  std::vector<int64_t> members = task;
  std::sort(members.begin(), members.end());
  const int group = jobs[members[0]].group;
  if (group >= 0) {
    const int64_t dim = groups[group].dim;
    std::fill(d_rows[group] + rows.first * dim, d_rows[group] + rows.second * dim, T(0));
  }
  for (const int64_t k : members) {
    const int64_t width = group >= 0 ? groups[group].dim : pieces[k].width;
    DispatchDim(width, [&](auto d) {
      BackwardJob<decltype(d)::value>(groups, pieces[k], jobs[k], kernel, units, batch, grad,
                                      group >= 0 ? d_rows[group] : nullptr, d_pieces[k], d_kernel,
                                      scratch);
    });
  }
}

}  // namespace

template <typename T, typename Idx>
ImplStatus BackwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                                const std::vector<ConcatPiece<T>>& pieces, int64_t batch,
                                const T* kernel, int64_t units, const T* grad,
                                const std::vector<T*>& d_rows, const std::vector<T*>& d_pieces,
                                T* d_kernel, const ParallelFor& parallel_for) {
  const std::vector<Job> jobs = MakeJobs(groups, pieces, batch, units, parallel_for);
  const ImplStatus ranges = CheckRanges(groups, jobs);
  if (!ranges.ok()) return ranges;
  // Tasks: fields whose distinct-row ranges overlap (in one group) share one
  // task, so that every d_rows row is summed by one task; a dense piece is a
  // task of its own. Rows no field reads are zeroed here.
  std::vector<int64_t> order(jobs.size());
  for (size_t k = 0; k < jobs.size(); ++k) order[k] = static_cast<int64_t>(k);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (jobs[a].group != jobs[b].group) return jobs[a].group < jobs[b].group;
    if (jobs[a].lo != jobs[b].lo) return jobs[a].lo < jobs[b].lo;
    return a < b;
  });
  std::vector<std::vector<int64_t>> tasks;
  std::vector<std::pair<int64_t, int64_t>> task_rows;  // rows [lo, hi) a task zeroes
  int64_t last = -1;                                   // the last task that reads rows
  for (const int64_t k : order) {
    const Job& job = jobs[k];
    if (job.group < 0 || job.hi == job.lo) {  // a dense piece or a field without positions
      tasks.push_back({k});
      task_rows.emplace_back(0, 0);
      continue;
    }
    if (last >= 0 && jobs[tasks[last][0]].group == job.group && job.lo < task_rows[last].second) {
      tasks[last].push_back(k);
      task_rows[last].second = std::max(task_rows[last].second, job.hi);
    } else {
      last = static_cast<int64_t>(tasks.size());
      tasks.push_back({k});
      task_rows.emplace_back(job.lo, job.hi);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    // Zero the rows outside every task's range.
    int64_t at = 0;
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (jobs[tasks[t][0]].group != static_cast<int>(g) ||
          task_rows[t].first == task_rows[t].second) {
        continue;
      }
      if (task_rows[t].first > at) {
        std::memset(d_rows[g] + at * groups[g].dim, 0,
                    sizeof(T) * (task_rows[t].first - at) * groups[g].dim);
      }
      at = std::max(at, task_rows[t].second);
    }
    if (groups[g].num_rows > at) {
      std::memset(d_rows[g] + at * groups[g].dim, 0,
                  sizeof(T) * (groups[g].num_rows - at) * groups[g].dim);
    }
  }
  int64_t total = 0;
  for (const Job& job : jobs) total = SaturatingAdd(total, job.cost);
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  parallel_for(num_tasks, std::max<int64_t>(1, total / std::max<int64_t>(num_tasks, 1)),
               [&](int64_t begin, int64_t end) {
                 Scratch<T> scratch;
                 for (int64_t t = begin; t < end; ++t) {
                   RunTask(groups, pieces, jobs, tasks[t], task_rows[t], kernel, units, batch, grad,
                           d_rows, d_pieces, d_kernel, &scratch);
                 }
               });
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                        \
  template ImplStatus BackwardConcatMatMul<T, Idx>(                                         \
      const std::vector<ConcatGroup<T, Idx>>&, const std::vector<ConcatPiece<T>>&, int64_t, \
      const T*, int64_t, const T*, const std::vector<T*>&, const std::vector<T*>&, T*,      \
      const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
