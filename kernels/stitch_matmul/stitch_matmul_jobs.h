// The pieces of a StitchConcatMatMul as jobs (stitch_matmul_impl.h): which
// distinct rows each field reads, whether it is projected or pooled, and the
// checks and per-row helpers that the forward (stitch_matmul_forward_impl.cc)
// and the gradient (stitch_matmul_impl.cc) share. Internal to the
// stitch_matmul family.
#ifndef HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_JOBS_H_
#define HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_JOBS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"
#include "kernels/stitch_matmul/stitch_matmul_rows.h"

namespace hybridtf {
namespace stitch_combine {
namespace matmul_jobs {

using matmul_rows::AddRow;

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
inline std::vector<Job> MakeJobs(const std::vector<ConcatGroup<T, Idx>>& groups,
                                 const std::vector<ConcatPiece<T>>& pieces, int64_t batch,
                                 int64_t units, const ParallelFor& parallel_for) {
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

// Every placed field's inverse indices must lie in its group's rows (MakeJobs
// found each field's smallest and largest one).
template <typename T, typename Idx>
inline ImplStatus CheckRanges(const std::vector<ConcatGroup<T, Idx>>& groups,
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

}  // namespace matmul_jobs
}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_MATMUL_STITCH_MATMUL_JOBS_H_
