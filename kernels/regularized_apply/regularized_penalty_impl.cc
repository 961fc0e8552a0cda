// CPU implementation of the regularization penalties' values (one read pass
// over the regularized rows of a packed table). See regularized_apply_impl.h.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/multiversion.h"
#include "kernels/regularized_apply/regularized_apply_impl.h"

namespace hybridtf {
namespace regularized_apply {

namespace {

// Values per block: the unit of parallel work and of the deterministic combination order.
constexpr int64_t kBlock = int64_t{1} << 15;
// Chunks of a block: 16 float lanes sum 32 values each (vectorizable, no reassociation), then the
// chunk's lanes are added in double, so rounding error stays that of 32-value float sums.
constexpr int kLanes = 16;
constexpr int64_t kChunk = kLanes * 32;

struct Sums {
  double abs = 0.0;
  double square = 0.0;
};

// sum(w * w) (and sum|w| when `with_abs`) of n values.
HYBRIDTF_MULTIVERSION Sums BlockSums(const float* __restrict w, int64_t n, bool with_abs) {
  Sums s;
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    float q[kLanes] = {0.f};
    for (int64_t k = 0; k < kChunk; k += kLanes) {
      for (int j = 0; j < kLanes; ++j) q[j] += w[i + k + j] * w[i + k + j];
    }
    double chunk = 0.0;
    for (int j = 0; j < kLanes; ++j) chunk += q[j];
    s.square += chunk;
    if (with_abs) {
      float a[kLanes] = {0.f};
      for (int64_t k = 0; k < kChunk; k += kLanes) {
        for (int j = 0; j < kLanes; ++j) a[j] += std::fabs(w[i + k + j]);
      }
      chunk = 0.0;
      for (int j = 0; j < kLanes; ++j) chunk += a[j];
      s.abs += chunk;
    }
  }
  for (; i < n; ++i) {
    const double x = static_cast<double>(w[i]);
    s.abs += std::fabs(x);
    s.square += static_cast<double>(w[i] * w[i]);
  }
  return s;
}

}  // namespace

ImplStatus Penalties(const float* var, int64_t rows, int64_t dim,
                     const std::vector<RegRange>& ranges, float* out, const ParallelFor& pf) {
  int64_t size = 0;
  if (rows < 0 || dim < 0 || !CheckedMul(rows, dim, &size)) {
    return ImplStatus::InvalidArgument("the table's shape [" + std::to_string(rows) + ", " +
                                       std::to_string(dim) +
                                       "] is negative or its size overflows int64.");
  }
  ImplStatus status = ValidateRanges(ranges, rows);
  if (!status.ok()) return status;
  // first[k]: index of range k's first block; a range of n values has ceil(n / kBlock) blocks.
  std::vector<int64_t> first(ranges.size() + 1, 0);
  for (size_t k = 0; k < ranges.size(); ++k) {
    const int64_t values = (ranges[k].end - ranges[k].begin) * dim;  // <= size: no overflow
    first[k + 1] = first[k] + (values + kBlock - 1) / kBlock;
  }
  std::vector<Sums> partial(static_cast<size_t>(first.back()));
  if (!partial.empty()) {
    pf(first.back(), 2 * kBlock, [&](int64_t begin, int64_t end) {
      size_t k = 0;
      for (int64_t b = begin; b < end; ++b) {
        while (first[k + 1] <= b) ++k;
        const int64_t start = ranges[k].begin * dim + (b - first[k]) * kBlock;
        const int64_t stop = std::min(ranges[k].end * dim, start + kBlock);
        partial[b] = BlockSums(var + start, stop - start, ranges[k].l1 != 0.f);
      }
    });
  }
  for (size_t k = 0; k < ranges.size(); ++k) {
    Sums s;
    for (int64_t b = first[k]; b < first[k + 1]; ++b) {
      s.abs += partial[b].abs;
      s.square += partial[b].square;
    }
    // Keras: 0 + l1 * reduce_sum(abs(w)) + (2 * l2) * l2_loss(w), each in float.
    float value = 0.f;
    if (ranges[k].l1 != 0.f) value = value + ranges[k].l1 * static_cast<float>(s.abs);
    if (ranges[k].l2 != 0.f) {
      value = value + (2.f * ranges[k].l2) * static_cast<float>(0.5 * s.square);
    }
    out[k] = value;
  }
  return ImplStatus::Ok();
}

}  // namespace regularized_apply
}  // namespace hybridtf
