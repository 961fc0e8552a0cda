// CPU implementation of StitchConcatMatMul and its gradient. See
// stitch_matmul_impl.h for the contract.
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
#include "kernels/stitch_matmul/stitch_matmul_rows.h"

namespace hybridtf {
namespace stitch_combine {

namespace {

using matmul_rows::AddRow;
using matmul_rows::AxpyRow;
using matmul_rows::AxpyRows4;
using matmul_rows::ProjectAdd;
using matmul_rows::ProjectRows4;

// Forward, the pieces are summed in at most this many chunks (each with its own
// [batch, units] partial result), fixed by the layout and not by the threads.
constexpr int64_t kMaxChunks = 8;

// A field is computed either through its distinct rows ("projected": each
// distinct row times the kernel block once, then the batch rows sum the
// projections) or row by row ("pooled": each output row is combined from its
// positions first, as StitchConcat would write it, then multiplied), whichever
// costs fewer multiply-adds: projected ~ range * dim * units + positions * units,
// pooled ~ rows * dim * units + positions * dim. Short distinct-row ranges of
// one-hot fields are projected; long bags (more distinct rows than batch rows)
// are pooled.

// One piece of the concatenation: a field of a group, or a dense input.
struct Job {
  int64_t piece = 0;
  int group = -1;
  int field = -1;
  int64_t pb = 0, pe = 0;  // the field's positions
  int64_t lo = 0, hi = 0;  // the distinct rows it reads
  int64_t max_index = -1;  // its largest inverse index (hi - 1 when in range)
  bool out_of_range = false;
  bool project = false;
  int64_t cost = 0;
};

// The [positions) and scale of output row r of job's field; false for an empty bag.
template <typename T, typename Idx>
HYBRIDTF_ROW_INLINE bool RowPositions(const ConcatGroup<T, Idx>& g, const Job& job, int64_t r,
                                      int64_t* b, int64_t* e, T* denom) {
  const Layout& layout = *g.layout;
  layout.Positions(job.field, layout.FirstRow(job.field) + r, b, e);
  if (*e == *b) return false;
  *denom = Denominator(layout.combiner(job.field), static_cast<const T*>(nullptr), *b, *e);
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
        job.cost = SaturatingMul(SaturatingMul(batch, piece.width), units);
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
        job.max_index = static_cast<int64_t>(hi);
        // Checked before hi + 1 (which overflows for the largest int64).
        job.out_of_range = job.lo < 0 || job.max_index >= g.num_rows;
        job.hi = job.out_of_range ? job.lo : job.max_index + 1;
      }
      const int64_t positions = job.pe - job.pb;
      const int64_t projected =
          SaturatingAdd(SaturatingMul(SaturatingMul(job.hi - job.lo, g.dim), units),
                        SaturatingMul(positions, units));
      const int64_t pooled = SaturatingAdd(SaturatingMul(SaturatingMul(batch, g.dim), units),
                                           SaturatingMul(positions, g.dim));
      job.project = projected < pooled;
      job.cost = SaturatingAdd(std::min(projected, pooled), SaturatingMul(batch, units));
    }
  });
  return jobs;
}

// out[0:dim] = combined rows of positions [b, e): their sum, divided by denom when `divide`.
template <typename T, typename Idx>
HYBRIDTF_ROW_INLINE void PoolRow(const ConcatGroup<T, Idx>& g, int64_t b, int64_t e, T denom,
                                 bool divide, T* __restrict out) {
  const int64_t dim = g.dim;
  std::fill(out, out + dim, T(0));
  for (int64_t i = b; i < e; ++i)
    AddRow<0>(out, g.rows + static_cast<int64_t>(g.inverse[i]) * dim, dim);
  if (divide) {
    for (int64_t c = 0; c < dim; ++c) out[c] /= denom;
  }
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
  scratch->resize(n + dim +
                  (job.project ? (job.hi - job.lo) * n : 0));  // every value is written first
  T* tmp = scratch->data();  // n values (projected) or dim values (pooled)
  T* proj = tmp + n + dim;
  if (job.project) {
    for (int64_t u = job.lo; u < job.hi; ++u) {
      ProjectAdd<U, T, false>(g.rows + u * dim, dim, kb, n, proj + (u - job.lo) * n);
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
    if (job.project) {  // a bag: sum of its positions' projections, then combined
      std::fill(tmp, tmp + n, T(0));
      for (int64_t i = b; i < e; ++i) {
        AddRow<U>(tmp, proj + (static_cast<int64_t>(g.inverse[i]) - job.lo) * n, n);
      }
      if (!sum) {
        for (int64_t j = 0; j < n; ++j) tmp[j] /= denom;
      }
      AddRow<U>(y + r * n, tmp, n);
      continue;
    }
    if (one_hot) {  // pooled one-hot: the row itself
      ProjectAdd<U>(g.rows + static_cast<int64_t>(g.inverse[b]) * dim, dim, kb, n, y + r * n);
      continue;
    }
    PoolRow(g, b, e, denom, !sum,
            tmp);  // pooled bag: combined as StitchConcat does, then multiplied
    ProjectAdd<U>(tmp, dim, kb, n, y + r * n);
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

// Per-thread scratch buffers of the gradient tasks.
template <typename T>
struct Scratch {
  std::vector<T> kt;  // the job's kernel block, transposed
  std::vector<T> values;
  std::vector<T> sums;          // projected fields: per distinct row, its summed gradient row
  std::vector<char> touched;    // per distinct row: read by some position
  std::vector<int64_t> row_of;  // bags: position -> output row
  std::vector<T> denom;         // bags: output row -> combiner denominator
  std::vector<T> block;         // row-by-row kernel gradients: one block of rows' sum
};

// Row-by-row kernel gradients (dense pieces, pooled fields) sum this many
// batch rows into a block buffer before adding the block into dK: a single
// running sum over the whole batch would collect a rounding error that grows
// with the batch (measured: 2.5e-6 of the largest value against TensorFlow's
// blocked matmul at batch 4096, which Adagrad then amplified to a 1.7e-5
// loss difference in 11 steps of a 200-field DeepFM).
constexpr int64_t kRowBlock = 32;

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
  if (job.group >= 0 && job.project) {  // summed per distinct row: no row-by-row block below
    const ConcatGroup<T, Idx>& g = groups[job.group];
    const Combiner combiner = g.layout->combiner(job.field);
    const bool divide = combiner == Combiner::kMean || combiner == Combiner::kSqrtn;
    BackwardProjected<D>(g, job, kt, n, batch, grad, divide, width, d_rows, dk, scratch);
    return;
  }
  scratch->block.assign(w * n, T(0));
  T* block = scratch->block.data();
  // dk += block, which then starts over (at the end of every kRowBlock rows and of the batch)
  auto end_block = [&](int64_t r) HYBRIDTF_LAMBDA_INLINE {
    if ((r + 1) % kRowBlock != 0 && r + 1 != batch) return;
    for (int64_t i = 0; i < w * n; ++i) dk[i] += block[i];
    std::fill(block, block + w * n, T(0));
  };
  if (job.group < 0) {
    for (int64_t b = 0; b < batch; ++b) {
      const T* gb = grad + b * n;
      T* out = d_piece + b * w;
      std::fill(out, out + w, T(0));
      ProjectAdd<D>(gb, n, kt, w, out);
      const T* db = piece.dense + b * w;
      for (int64_t c = 0; c < width; ++c) AxpyRow<0>(block + c * n, db[c], gb, n);
      end_block(b);
    }
    return;
  }
  const ConcatGroup<T, Idx>& g = groups[job.group];
  const bool one_hot = g.layout->combiner(job.field) == Combiner::kNone;
  const bool sum = g.layout->combiner(job.field) == Combiner::kSum;
  const bool divide = !one_hot && !sum;
  scratch->values.assign(2 * w, T(0));
  T* t = scratch->values.data();  // the row's gradient times the kernel block's transpose
  T* pooled = t + w;              // the combined row
  for (int64_t r = 0; r < batch; ++r) {
    int64_t b = 0, e = 0;
    T denom = T(1);
    if (!RowPositions(g, job, r, &b, &e, &denom)) {
      end_block(r);
      continue;
    }
    const T* gr = grad + r * n;
    // d kernel += combined row (as forward) x gradient row; each position's
    // distinct row gets the gradient row times the kernel block's transpose, combined
    const T* row = g.rows + static_cast<int64_t>(g.inverse[b]) * w;
    if (!one_hot) {
      PoolRow(g, b, e, denom, divide, pooled);
      row = pooled;
    }
    for (int64_t c = 0; c < width; ++c) AxpyRow<0>(block + c * n, row[c], gr, n);
    end_block(r);
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

// Every placed field's inverse indices must lie in its group's rows (MakeJobs
// found each field's smallest and largest one).
template <typename T, typename Idx>
ImplStatus CheckRanges(const std::vector<ConcatGroup<T, Idx>>& groups,
                       const std::vector<Job>& jobs) {
  for (const Job& job : jobs) {
    if (job.group < 0 || job.pe == job.pb) continue;
    const int64_t rows = groups[job.group].num_rows;
    if (job.out_of_range) {
      return ImplStatus::InvalidArgument(
          "group " + std::to_string(job.group) + ", field " + std::to_string(job.field) +
          ": an inverse index is outside [0, " + std::to_string(rows) + ") (smallest " +
          std::to_string(job.lo) + ", largest " + std::to_string(job.max_index) +
          "); the inverse must index the group's gathered rows.");
    }
  }
  return ImplStatus::Ok();
}

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
  const std::vector<int64_t> bounds = ChunkBounds(jobs);
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  // Chunk 0 adds into out; chunk c > 0 into partial[c - 1].
  std::unique_ptr<T[]> partial(new T[(chunks - 1) * batch * units]);
  int64_t total = 0;
  for (const Job& job : jobs) total = SaturatingAdd(total, job.cost);
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
  if (chunks == 1) return ImplStatus::Ok();
  parallel_for(batch, chunks * units, [&](int64_t begin, int64_t end) {
    for (int64_t c = 1; c < chunks; ++c) {
      const T* p = partial.get() + (c - 1) * batch * units;
      for (int64_t i = begin * units; i < end * units; ++i) out[i] += p[i];
    }
  });
  return ImplStatus::Ok();
}

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
                   std::vector<int64_t> members = tasks[t];
                   std::sort(members.begin(), members.end());
                   const int group = jobs[members[0]].group;
                   if (group >= 0) {
                     const int64_t dim = groups[group].dim;
                     std::fill(d_rows[group] + task_rows[t].first * dim,
                               d_rows[group] + task_rows[t].second * dim, T(0));
                   }
                   for (const int64_t k : members) {
                     const int64_t width = group >= 0 ? groups[group].dim : pieces[k].width;
                     DispatchDim(width, [&](auto d) {
                       BackwardJob<decltype(d)::value>(
                           groups, pieces[k], jobs[k], kernel, units, batch, grad,
                           group >= 0 ? d_rows[group] : nullptr, d_pieces[k], d_kernel, &scratch);
                     });
                   }
                 }
               });
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                           \
  template ImplStatus ForwardConcatMatMul<T, Idx>(const std::vector<ConcatGroup<T, Idx>>&,     \
                                                  const std::vector<ConcatPiece<T>>&, int64_t, \
                                                  const T*, int64_t, T*, const ParallelFor&);  \
  template ImplStatus BackwardConcatMatMul<T, Idx>(                                            \
      const std::vector<ConcatGroup<T, Idx>>&, const std::vector<ConcatPiece<T>>&, int64_t,    \
      const T*, int64_t, const T*, const std::vector<T*>&, const std::vector<T*>&, T*,         \
      const ParallelFor&);

HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace stitch_combine
}  // namespace hybridtf
