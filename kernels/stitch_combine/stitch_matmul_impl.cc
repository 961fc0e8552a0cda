// CPU implementation of StitchConcatMatMul and its gradient. See
// stitch_matmul_impl.h for the contract.
#include "kernels/stitch_combine/stitch_matmul_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "kernels/common/dispatch_dim.h"
#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace stitch_combine {

namespace {

// Forward, the pieces are summed in at most this many chunks (each with its own
// [batch, units] partial result), fixed by the layout and not by the threads.
constexpr int64_t kMaxChunks = 8;

// A field's distinct rows are projected once when the range it reads is at
// most this fraction (num / den) of its positions; otherwise it is computed
// position by position.
constexpr int64_t kProjectNum = 3;
constexpr int64_t kProjectDen = 4;

// One piece of the concatenation: a field of a group, or a dense input.
struct Job {
  int64_t piece = 0;
  int group = -1;
  int field = -1;
  int64_t pb = 0, pe = 0;  // the field's positions
  int64_t lo = 0, hi = 0;  // the distinct rows it reads
  bool project = false;
  int64_t cost = 0;
};

template <typename T>
T BagDenominator(Combiner combiner, int64_t n) {
  if (combiner == Combiner::kMean) return static_cast<T>(n);
  if (combiner == Combiner::kSqrtn) return std::sqrt(static_cast<T>(n));
  return T(1);
}

// acc[0:n] += e[0:dim] @ k, k being dim rows of n values (U == n when U > 0).
template <int U, typename T>
inline void ProjectAdd(const T* __restrict e, int64_t dim, const T* __restrict k, int64_t n,
                       T* __restrict acc) {
  if constexpr (U > 0) {
    T a[U];
    for (int j = 0; j < U; ++j) a[j] = acc[j];
    for (int64_t c = 0; c < dim; ++c) {
      const T x = e[c];
      const T* kc = k + c * U;
      for (int j = 0; j < U; ++j) a[j] += x * kc[j];
    }
    for (int j = 0; j < U; ++j) acc[j] = a[j];
  } else {
    for (int64_t c = 0; c < dim; ++c) {
      const T x = e[c];
      const T* kc = k + c * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += x * kc[j];
    }
  }
}

// acc[0:n] += src[0:n].
template <int U, typename T>
inline void AddRow(T* __restrict acc, const T* __restrict src, int64_t n) {
  const int64_t m = U > 0 ? U : n;
  for (int64_t j = 0; j < m; ++j) acc[j] += src[j];
}

// acc[0:n] += x * src[0:n].
template <int U, typename T>
inline void AxpyRow(T* __restrict acc, T x, const T* __restrict src, int64_t n) {
  const int64_t m = U > 0 ? U : n;
  for (int64_t j = 0; j < m; ++j) acc[j] += x * src[j];
}

// The [positions) and scale of output row r of job's field; false for an empty bag.
template <typename T, typename Idx>
inline bool RowPositions(const ConcatGroup<T, Idx>& g, const Job& job, int64_t r, int64_t* b,
                         int64_t* e, T* denom) {
  const Layout& layout = *g.layout;
  layout.Positions(job.field, layout.FirstRow(job.field) + r, b, e);
  if (*e == *b) return false;
  *denom = BagDenominator<T>(layout.combiner(job.field), *e - *b);
  return true;
}

// Fills every job's positions, distinct-row range, mode and cost.
template <typename T, typename Idx>
std::vector<Job> MakeJobs(const std::vector<ConcatGroup<T, Idx>>& groups,
                          const std::vector<ConcatPiece<T>>& pieces, int64_t batch, int64_t units,
                          const ParallelFor& parallel_for) {
  std::vector<Job> jobs(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    jobs[k].piece = static_cast<int64_t>(k);
    jobs[k].group = pieces[k].group;
    jobs[k].field = pieces[k].field;
  }
  parallel_for(static_cast<int64_t>(jobs.size()), 4 * batch, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      Job& job = jobs[k];
      const ConcatPiece<T>& piece = pieces[k];
      if (job.group < 0) {
        job.cost = batch * piece.width * units;
        continue;
      }
      const ConcatGroup<T, Idx>& g = groups[job.group];
      g.layout->FieldPositions(job.field, &job.pb, &job.pe);
      if (job.pe > job.pb) {
        Idx lo = g.inverse[job.pb], hi = g.inverse[job.pb];
        for (int64_t i = job.pb + 1; i < job.pe; ++i) {
          lo = std::min(lo, g.inverse[i]);
          hi = std::max(hi, g.inverse[i]);
        }
        job.lo = static_cast<int64_t>(lo);
        job.hi = static_cast<int64_t>(hi) + 1;
      }
      const int64_t positions = job.pe - job.pb;
      job.project = (job.hi - job.lo) * kProjectDen <= positions * kProjectNum;
      job.cost = (job.project ? (job.hi - job.lo) * g.dim : positions * g.dim) * units +
                 (positions + batch) * units;
    }
  });
  return jobs;
}

// Adds the job's piece @ its kernel block to y ([batch, n]).
template <int U, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void ForwardJob(const std::vector<ConcatGroup<T, Idx>>& groups,
                                      const ConcatPiece<T>& piece, const Job& job, const T* kernel,
                                      int64_t n, int64_t batch, std::vector<T>* scratch, T* y) {
  const T* kb = kernel + piece.column * n;
  if (job.group < 0) {
    for (int64_t b = 0; b < batch; ++b) {
      ProjectAdd<U>(piece.dense + b * piece.width, piece.width, kb, n, y + b * n);
    }
    return;
  }
  const ConcatGroup<T, Idx>& g = groups[job.group];
  const int64_t dim = g.dim;
  const bool one_hot = g.layout->combiner(job.field) == Combiner::kNone;
  const bool sum = g.layout->combiner(job.field) == Combiner::kSum;
  scratch->assign(n + (job.project ? (job.hi - job.lo) * n : 0), T(0));
  T* tmp = scratch->data();
  T* proj = tmp + n;
  if (job.project) {
    for (int64_t u = job.lo; u < job.hi; ++u) {
      ProjectAdd<U>(g.rows + u * dim, dim, kb, n, proj + (u - job.lo) * n);
    }
    if (one_hot) {
      const Idx* inv = g.inverse + job.pb;
      for (int64_t r = 0; r < batch; ++r) {
        AddRow<U>(y + r * n, proj + (static_cast<int64_t>(inv[r]) - job.lo) * n, n);
      }
      return;
    }
  }
  for (int64_t r = 0; r < batch; ++r) {
    int64_t b = 0, e = 0;
    T denom = T(1);
    if (!RowPositions(g, job, r, &b, &e, &denom)) continue;
    if (one_hot) {  // direct one-hot: one position
      ProjectAdd<U>(g.rows + static_cast<int64_t>(g.inverse[b]) * dim, dim, kb, n, y + r * n);
      continue;
    }
    std::fill(tmp, tmp + n, T(0));
    for (int64_t i = b; i < e; ++i) {
      const int64_t u = static_cast<int64_t>(g.inverse[i]);
      if (job.project) {
        AddRow<U>(tmp, proj + (u - job.lo) * n, n);
      } else {
        ProjectAdd<U>(g.rows + u * dim, dim, kb, n, tmp);
      }
    }
    if (!sum) {
      for (int64_t j = 0; j < n; ++j) tmp[j] /= denom;
    }
    AddRow<U>(y + r * n, tmp, n);
  }
}

// Kernel block of a piece transposed: kt[j * w + c] = kernel[column + c, j].
template <typename T>
void TransposeBlock(const T* kernel, int64_t column, int64_t w, int64_t n, std::vector<T>* kt) {
  kt->resize(w * n);
  for (int64_t c = 0; c < w; ++c) {
    for (int64_t j = 0; j < n; ++j) (*kt)[j * w + c] = kernel[(column + c) * n + j];
  }
}

// Gradient of one job: its kernel rows (overwritten), d_rows of the rows it
// reads (added to; zeroed by the caller) or its dense input (overwritten).
template <int U, typename T, typename Idx>
HYBRIDTF_MULTIVERSION void BackwardJob(const std::vector<ConcatGroup<T, Idx>>& groups,
                                       const ConcatPiece<T>& piece, const Job& job, const T* kernel,
                                       int64_t n, int64_t batch, const T* grad, T* d_rows,
                                       T* d_piece, T* d_kernel, std::vector<T>* scratch) {
  const int64_t w = job.group < 0 ? piece.width : groups[job.group].dim;
  T* dk = d_kernel + piece.column * n;
  std::fill(dk, dk + w * n, T(0));
  std::vector<T> kt;
  TransposeBlock(kernel, piece.column, w, n, &kt);
  if (job.group < 0) {
    for (int64_t b = 0; b < batch; ++b) {
      const T* gb = grad + b * n;
      T* out = d_piece + b * w;
      std::fill(out, out + w, T(0));
      ProjectAdd<0>(gb, n, kt.data(), w, out);
      const T* db = piece.dense + b * w;
      for (int64_t c = 0; c < w; ++c) AxpyRow<U>(dk + c * n, db[c], gb, n);
    }
    return;
  }
  const ConcatGroup<T, Idx>& g = groups[job.group];
  const bool one_hot = g.layout->combiner(job.field) == Combiner::kNone;
  const bool sum = g.layout->combiner(job.field) == Combiner::kSum;
  const int64_t range = job.project ? job.hi - job.lo : 0;
  scratch->assign(n + w + range * n, T(0));
  T* tmp = scratch->data();  // the row's scaled gradient
  T* t = tmp + n;            // its product with the kernel block's transpose
  T* s = t + w;              // projected: per distinct row, its summed gradient
  for (int64_t r = 0; r < batch; ++r) {
    int64_t b = 0, e = 0;
    T denom = T(1);
    if (!RowPositions(g, job, r, &b, &e, &denom)) continue;
    const T* gr = grad + r * n;
    if (!one_hot && !sum) {
      for (int64_t j = 0; j < n; ++j) tmp[j] = gr[j] / denom;
      gr = tmp;
    }
    if (job.project) {
      for (int64_t i = b; i < e; ++i) {
        AddRow<U>(s + (static_cast<int64_t>(g.inverse[i]) - job.lo) * n, gr, n);
      }
      continue;
    }
    std::fill(t, t + w, T(0));
    ProjectAdd<0>(gr, n, kt.data(), w, t);
    for (int64_t i = b; i < e; ++i) {
      const int64_t u = static_cast<int64_t>(g.inverse[i]);
      const T* row = g.rows + u * w;
      T* du = d_rows + u * w;
      for (int64_t c = 0; c < w; ++c) du[c] += t[c];
      for (int64_t c = 0; c < w; ++c) AxpyRow<U>(dk + c * n, row[c], gr, n);
    }
  }
  for (int64_t u = job.lo; u < job.lo + range; ++u) {
    const T* su = s + (u - job.lo) * n;
    const T* row = g.rows + u * w;
    ProjectAdd<0>(su, n, kt.data(), w, d_rows + u * w);
    for (int64_t c = 0; c < w; ++c) AxpyRow<U>(dk + c * n, row[c], su, n);
  }
}

// Splits jobs [0, size) into at most kMaxChunks runs of about equal cost.
std::vector<int64_t> ChunkBounds(const std::vector<Job>& jobs) {
  int64_t total = 0;
  for (const Job& job : jobs) total += std::max<int64_t>(job.cost, 1);
  const int64_t chunks = std::min<int64_t>(kMaxChunks, static_cast<int64_t>(jobs.size()));
  std::vector<int64_t> bounds(1, 0);
  int64_t acc = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    acc += std::max<int64_t>(jobs[k].cost, 1);
    const int64_t next = static_cast<int64_t>(bounds.size());
    if (next < chunks && acc * chunks >= total * next)
      bounds.push_back(static_cast<int64_t>(k) + 1);
  }
  if (bounds.back() != static_cast<int64_t>(jobs.size())) {
    bounds.push_back(static_cast<int64_t>(jobs.size()));
  }
  return bounds;
}

}  // namespace

template <typename T, typename Idx>
void ForwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                         const std::vector<ConcatPiece<T>>& pieces, int64_t batch, const T* kernel,
                         int64_t units, T* out, const ParallelFor& parallel_for) {
  if (pieces.empty() || batch == 0 || units == 0) {
    std::fill(out, out + batch * units, T(0));
    return;
  }
  const std::vector<Job> jobs = MakeJobs(groups, pieces, batch, units, parallel_for);
  const std::vector<int64_t> bounds = ChunkBounds(jobs);
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  // Chunk 0 adds into out; chunk c > 0 into partial[c - 1].
  std::unique_ptr<T[]> partial(new T[(chunks - 1) * batch * units]);
  int64_t total = 0;
  for (const Job& job : jobs) total += job.cost;
  parallel_for(chunks, std::max<int64_t>(1, total / chunks), [&](int64_t begin, int64_t end) {
    std::vector<T> scratch;
    for (int64_t c = begin; c < end; ++c) {
      T* y = c == 0 ? out : partial.get() + (c - 1) * batch * units;
      std::fill(y, y + batch * units, T(0));
      for (int64_t k = bounds[c]; k < bounds[c + 1]; ++k) {
        DispatchDim(units, [&](auto u) {
          ForwardJob<decltype(u)::value>(groups, pieces[k], jobs[k], kernel, units, batch, &scratch,
                                         y);
        });
      }
    }
  });
  if (chunks == 1) return;
  parallel_for(batch, chunks * units, [&](int64_t begin, int64_t end) {
    for (int64_t c = 1; c < chunks; ++c) {
      const T* p = partial.get() + (c - 1) * batch * units;
      for (int64_t i = begin * units; i < end * units; ++i) out[i] += p[i];
    }
  });
}

template <typename T, typename Idx>
void BackwardConcatMatMul(const std::vector<ConcatGroup<T, Idx>>& groups,
                          const std::vector<ConcatPiece<T>>& pieces, int64_t batch, const T* kernel,
                          int64_t units, const T* grad, const std::vector<T*>& d_rows,
                          const std::vector<T*>& d_pieces, T* d_kernel,
                          const ParallelFor& parallel_for) {
  const std::vector<Job> jobs = MakeJobs(groups, pieces, batch, units, parallel_for);
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
  for (const Job& job : jobs) total += job.cost;
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  parallel_for(num_tasks, std::max<int64_t>(1, total / std::max<int64_t>(num_tasks, 1)),
               [&](int64_t begin, int64_t end) {
                 std::vector<T> scratch;
                 for (int64_t t = begin; t < end; ++t) {
                   std::vector<int64_t> members = tasks[t];
                   std::sort(members.begin(), members.end());
                   const int group = jobs[members[0]].group;
                   if (group >= 0) {
                     const int64_t dim = groups[group].dim;
                     std::fill(d_rows[group] + task_rows[t].first * dim,
                               d_rows[group] + task_rows[t].second * dim, T(0));
                   }
                   for (const int64_t k : members) {
                     DispatchDim(units, [&](auto u) {
                       BackwardJob<decltype(u)::value>(
                           groups, pieces[k], jobs[k], kernel, units, batch, grad,
                           group >= 0 ? d_rows[group] : nullptr, d_pieces[k], d_kernel, &scratch);
                     });
                   }
                 }
               });
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                               \
  template void ForwardConcatMatMul<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,               \
                                            const std::vector<ConcatPiece<T>>&, int64_t, const T*, \
                                            int64_t, T*, const ParallelFor&);                      \
  template void BackwardConcatMatMul<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,              \
                                             const std::vector<ConcatPiece<T>>&, int64_t,          \
                                             const T*, int64_t, const T*, const std::vector<T*>&,  \
                                             const std::vector<T*>&, T*, const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
