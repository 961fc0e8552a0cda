// CPU implementation of GatherRows. See gather_rows_impl.h.
#include "kernels/gather_rows/gather_rows_impl.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/common/dispatch_dim.h"

namespace hybridtf {
namespace gather_rows {

namespace {

// Rows ahead whose table row is prefetched.
constexpr int64_t kPrefetch = 16;

// Copies rows [begin, end); returns the first position whose index is out of
// range (its row is zeroed), or end.
template <int D, typename T, typename Idx>
int64_t CopyRows(const T* table, int64_t num_rows, int64_t dim, const Idx* indices, int64_t begin,
                 int64_t end, int64_t n, T* out) {
  const int64_t w = D > 0 ? D : dim;
  int64_t bad = end;
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetch < n) {
      const int64_t ahead = static_cast<int64_t>(indices[i + kPrefetch]);
      if (ahead >= 0 && ahead < num_rows) __builtin_prefetch(table + ahead * w);
    }
    const int64_t r = static_cast<int64_t>(indices[i]);
    T* dst = out + i * w;
    if (r < 0 || r >= num_rows) {
      std::fill(dst, dst + w, T(0));
      bad = std::min(bad, i);
      continue;
    }
    std::memcpy(dst, table + r * w, sizeof(T) * w);  // a constant size when D > 0
  }
  return bad;
}

ImplStatus OutOfRange(int64_t position, int64_t index, int64_t num_rows) {
  return ImplStatus::InvalidArgument(
      "indices[" + std::to_string(position) + "] = " + std::to_string(index) +
      " is outside the table's rows [0, " + std::to_string(num_rows) +
      "); gather only ids of the table (e.g. unique_partition's).");
}

}  // namespace

template <typename T, typename Idx>
ImplStatus GatherRows(const T* table, int64_t num_rows, int64_t dim, const Idx* indices, int64_t n,
                      T* out, const ParallelFor& parallel_for) {
  if (n == 0 || dim == 0) {
    for (int64_t i = 0; i < n; ++i) {  // nothing to copy, but the indices must still be valid
      const int64_t r = static_cast<int64_t>(indices[i]);
      if (r < 0 || r >= num_rows) return OutOfRange(i, r, num_rows);
    }
    return ImplStatus::Ok();
  }
  std::atomic<int64_t> first_bad(n);
  parallel_for(n, 2 * dim + 8, [&](int64_t begin, int64_t end) {
    int64_t bad = end;
    DispatchDim(dim, [&](auto d) {
      bad = CopyRows<decltype(d)::value>(table, num_rows, dim, indices, begin, end, n, out);
    });
    if (bad == end) return;
    int64_t seen = first_bad.load();
    while (bad < seen && !first_bad.compare_exchange_weak(seen, bad)) {
    }
  });
  const int64_t bad = first_bad.load();
  return bad < n ? OutOfRange(bad, static_cast<int64_t>(indices[bad]), num_rows) : ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE(T, Idx)                                                          \
  template ImplStatus GatherRows<T, Idx>(const T*, int64_t, int64_t, const Idx*, int64_t, T*, \
                                         const ParallelFor&);
HYBRIDTF_INSTANTIATE(float, int32_t)
HYBRIDTF_INSTANTIATE(float, int64_t)
HYBRIDTF_INSTANTIATE(double, int32_t)
HYBRIDTF_INSTANTIATE(double, int64_t)
#undef HYBRIDTF_INSTANTIATE

}  // namespace gather_rows
}  // namespace hybridtf
