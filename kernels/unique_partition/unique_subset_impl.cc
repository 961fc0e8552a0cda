// CPU implementation of UniqueSubset. See unique_subset_impl.h for the
// contract.
//
// Prepare validates the attrs and the source: field sizes, strictly ascending
// unique ids (one branch-free parallel pass), the [min, max] interval of every
// A field's inverse values (one parallel pass over A's positions). Every B
// field's segment of A's unique ids comes from two binary searches; the
// intervals prove that its positions fall in the segment and that no other A
// field uses it. Finish is then two branch-free parallel passes that cannot
// fail: the shifted copy of the segments into B's unique ids and the inverse,
// shifted by a constant per field.
#include "kernels/unique_partition/unique_subset_impl.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>

#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace unique_subset {

namespace {

template <typename... Args>
ImplStatus Invalid(const Args&... args) {
  std::ostringstream out;
  out << "UniqueSubset: ";
  (out << ... << args);
  return ImplStatus::InvalidArgument(out.str());
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// x86-64's baseline SSE2 has no 32-bit (or 64-bit) vector min/max; compiled
// for AVX2 too, the min/max pass runs about 4x faster where the CPU has it.

// Smallest and largest of v[0..n), n >= 1.
template <typename Idx>
HYBRIDTF_MULTIVERSION void MinMax(const Idx* v, int64_t n, int64_t* min_out, int64_t* max_out) {
  Idx mn = v[0], mx = v[0];
  for (int64_t i = 0; i < n; ++i) {
    const Idx x = v[i];
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
  }
  *min_out = static_cast<int64_t>(mn);
  *max_out = static_cast<int64_t>(mx);
}

}  // namespace

template <typename Id>
ImplStatus ValidateFieldMap(const FieldMap& map) {
  const size_t fb = map.source_fields.size();
  if (fb == 0 || map.source_offsets.size() != fb || map.target_offsets.size() != fb ||
      map.num_rows.size() != fb) {
    return Invalid(
        "source_fields, source_offsets, target_offsets and num_rows need one entry per "
        "field of B (at least one), got lengths ",
        fb, ", ", map.source_offsets.size(), ", ", map.target_offsets.size(), " and ",
        map.num_rows.size(), ". Pass equal-length lists.");
  }
  const int64_t id_max = static_cast<int64_t>(std::numeric_limits<Id>::max());
  for (size_t k = 0; k < fb; ++k) {
    const int64_t rows = map.num_rows[k], src = map.source_offsets[k], dst = map.target_offsets[k];
    if (map.source_fields[k] < 0) {
      return Invalid("source_fields[", k, "] = ", map.source_fields[k],
                     " is negative; it must index a field of A.");
    }
    if (rows < 1) {
      return Invalid("num_rows[", k, "] = ", rows, " must be >= 1 (the rows of field ", k,
                     "'s member table).");
    }
    if (src < 0 || dst < 0) {
      return Invalid("field ", k, ": source_offsets = ", src, " and target_offsets = ", dst,
                     " must be >= 0 (packed row offsets of the member table in A and in B).");
    }
    if (src > kInt64Max - rows || dst > kInt64Max - rows) {
      return Invalid("field ", k, ": offset + num_rows overflows int64 (source_offsets = ", src,
                     ", target_offsets = ", dst, ", num_rows = ", rows, ").");
    }
    if (rows - 1 > id_max || dst > id_max - (rows - 1)) {
      return Invalid("field ", k, ": B's packed rows [", dst, ", ", dst + rows,
                     ") do not fit the id dtype (largest id ", id_max, "); use int64 ids.");
    }
  }
  std::vector<int64_t> order(fb);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return map.target_offsets[x] < map.target_offsets[y];
  });
  for (size_t r = 1; r < fb; ++r) {
    const int64_t p = order[r - 1], q = order[r];
    if (map.target_offsets[q] < map.target_offsets[p] + map.num_rows[p]) {
      const int64_t a = std::min(p, q), b = std::max(p, q);
      return Invalid("the target ranges of fields ", a, " and ", b, " overlap: [",
                     map.target_offsets[a], ", ", map.target_offsets[a] + map.num_rows[a],
                     ") and [", map.target_offsets[b], ", ",
                     map.target_offsets[b] + map.num_rows[b],
                     "). Every field of B must look up its own member table of B; fields that "
                     "share a table need unique_partition on B's packed ids instead.");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::CheckAscending() const {
  using U = std::make_unsigned_t<Id>;
  constexpr int kSignBit = 8 * sizeof(Id) - 1;
  const U* u = reinterpret_cast<const U*>(source_.unique_ids);
  const int64_t pairs = source_.num_unique - 1;
  if (pairs <= 0) return ImplStatus::Ok();
  std::atomic<bool> bad{false};
  parallel_for_(pairs, 2, [&](int64_t begin, int64_t end) {
    // Sign bit of d ^ ((x ^ y) & (d ^ x)), d = x - y, is x < y (signed), without
    // overflow and without a compare that SSE2 lacks for 64-bit lanes.
    U not_less = 0;
    for (int64_t i = begin; i < end; ++i) {
      const U x = u[i], y = u[i + 1], d = x - y;
      not_less |= static_cast<U>(~(d ^ ((x ^ y) & (d ^ x))));
    }
    if (not_less >> kSignBit) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return ImplStatus::Ok();
  const Id* v = source_.unique_ids;
  for (int64_t i = 0; i < pairs; ++i) {
    if (!(v[i] < v[i + 1])) {
      return Invalid("unique_ids must be strictly ascending, but unique_ids[", i,
                     "] = ", static_cast<int64_t>(v[i]), " and unique_ids[", i + 1,
                     "] = ", static_cast<int64_t>(v[i + 1]),
                     ". Pass A's result of unique_partition(packed_ids, num_partitions=1, "
                     "sort_ids=True).");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
void UniqueSubsetCpu<Id, Idx>::InverseIntervals(const std::vector<int64_t>& pos_a) {
  // Fixed work units (field, chunk), so that the result does not depend on threads.
  constexpr int64_t kChunk = int64_t{1} << 14;
  struct Unit {
    int64_t field, begin, end;
  };
  std::vector<Unit> units;
  const int64_t fa = source_.num_fields;
  for (int64_t a = 0; a < fa; ++a) {
    for (int64_t b = pos_a[a]; b < pos_a[a + 1]; b += kChunk) {
      units.push_back({a, b, std::min(pos_a[a + 1], b + kChunk)});
    }
  }
  std::vector<int64_t> unit_min(units.size()), unit_max(units.size());
  const Idx* inverse = source_.inverse;
  parallel_for_(static_cast<int64_t>(units.size()), 2 * kChunk, [&](int64_t first, int64_t last) {
    for (int64_t w = first; w < last; ++w) {
      MinMax(inverse + units[w].begin, units[w].end - units[w].begin, &unit_min[w], &unit_max[w]);
    }
  });
  min_a_.assign(static_cast<size_t>(fa), std::numeric_limits<int64_t>::max());
  max_a_.assign(static_cast<size_t>(fa), std::numeric_limits<int64_t>::min());
  for (size_t w = 0; w < units.size(); ++w) {
    const int64_t a = units[w].field;
    min_a_[a] = std::min(min_a_[a], unit_min[w]);
    max_a_[a] = std::max(max_a_[a], unit_max[w]);
  }
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::CheckInverseRanges() const {
  for (size_t k = 0; k < fields_.size(); ++k) {
    const Field& f = fields_[k];
    const int64_t a = f.source_field;
    if (f.size == 0 || (min_a_[a] >= f.lo && max_a_[a] < f.lo + f.count)) continue;
    for (int64_t j = 0; j < f.size; ++j) {  // the first bad position, for the message
      const int64_t value = static_cast<int64_t>(source_.inverse[f.source_pos + j]);
      if (value >= f.lo && value < f.lo + f.count) continue;
      return Invalid("B field ", k, " (A field ", a, "), position ", j, ": inverse[",
                     f.source_pos + j, "] = ", value, " is outside [", f.lo, ", ", f.lo + f.count,
                     "), the unique ids of A in that field's member rows [", f.source_offset, ", ",
                     f.source_offset + f.num_rows,
                     "). A's inverse and unique_ids must come from one "
                     "unique_partition(packed_ids, num_partitions=1, sort_ids=True) of A's "
                     "packed ids whose field ",
                     a, " holds ids of the member table at offset ", f.source_offset, " with ",
                     f.num_rows, " rows; check source_fields, source_offsets and num_rows.");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::CheckAllInRange(const std::vector<int64_t>& pos_a) const {
  // The inverse values of the A fields that B does not read must index A's
  // unique ids too (CheckInverseRanges checks the read ones against their
  // segments): an out-of-range value there would otherwise hide that field's
  // ids from the exclusivity check.
  std::vector<bool> read(static_cast<size_t>(source_.num_fields), false);
  for (const Field& f : fields_) read[f.source_field] = true;
  for (int64_t a = 0; a < source_.num_fields; ++a) {
    if (read[a] || pos_a[a + 1] == pos_a[a] || (min_a_[a] >= 0 && max_a_[a] < source_.num_unique)) {
      continue;
    }
    for (int64_t i = pos_a[a]; i < pos_a[a + 1]; ++i) {
      const int64_t value = static_cast<int64_t>(source_.inverse[i]);
      if (value >= 0 && value < source_.num_unique) continue;
      return Invalid("inverse[", i, "] = ", value, " is outside [0, ", source_.num_unique,
                     ") (A field ", a,
                     "), the indices of unique_ids. Pass A's inverse and unique_ids from one "
                     "unique_partition(packed_ids, num_partitions=1, sort_ids=True).");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::CheckUsed() const {
  // Every unique id of a B field's segment must be used by a position of its A
  // field (true of any unique_partition result; the intervals alone cannot
  // prove it): mark the A unique ids that the read A fields use.
  const int64_t ua = source_.num_unique;
  std::unique_ptr<std::atomic<uint8_t>[]> used(new std::atomic<uint8_t>[ua]());
  std::vector<bool> read(static_cast<size_t>(source_.num_fields), false);
  constexpr int64_t kChunk = int64_t{1} << 14;
  struct Unit {
    int64_t begin, end;
  };
  std::vector<Unit> units;
  for (const Field& f : fields_) {
    if (f.count == 0 || read[f.source_field]) continue;
    read[f.source_field] = true;
    for (int64_t b = f.source_pos; b < f.source_pos + f.size; b += kChunk) {
      units.push_back({b, std::min(f.source_pos + f.size, b + kChunk)});
    }
  }
  const Idx* inverse = source_.inverse;
  parallel_for_(static_cast<int64_t>(units.size()), 2 * kChunk, [&](int64_t first, int64_t last) {
    for (int64_t w = first; w < last; ++w) {
      for (int64_t i = units[w].begin; i < units[w].end; ++i) {
        used[static_cast<int64_t>(inverse[i])].store(1, std::memory_order_relaxed);
      }
    }
  });
  for (size_t k = 0; k < fields_.size(); ++k) {
    const Field& f = fields_[k];
    for (int64_t u = f.lo; u < f.lo + f.count; ++u) {
      if (used[u].load(std::memory_order_relaxed)) continue;
      return Invalid("unique_ids[", u, "] = ", static_cast<int64_t>(source_.unique_ids[u]),
                     " lies in B field ", k, "'s member rows [", f.source_offset, ", ",
                     f.source_offset + f.num_rows, ") but no position of A field ", f.source_field,
                     " uses it. Pass A's inverse and unique_ids from one "
                     "unique_partition(packed_ids, num_partitions=1, sort_ids=True).");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::CheckExclusive() const {
  // A fields' intervals by ascending min; per prefix the largest max and the
  // second largest (another field's), to find "a field other than a whose
  // interval meets [lo, hi)" with one binary search per B field.
  struct Interval {
    int64_t min, max, field;
  };
  std::vector<Interval> intervals;
  for (int64_t a = 0; a < source_.num_fields; ++a) {
    if (source_.field_sizes[a] > 0) intervals.push_back({min_a_[a], max_a_[a], a});
  }
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& x, const Interval& y) { return x.min < y.min; });
  const size_t m = intervals.size();
  std::vector<int64_t> mins(m), best(m), best_field(m), second(m);
  int64_t b = std::numeric_limits<int64_t>::min(), bf = -1, s = b;
  for (size_t i = 0; i < m; ++i) {
    const Interval& iv = intervals[i];
    if (iv.max > b) {
      s = b;
      b = iv.max;
      bf = iv.field;
    } else if (iv.max > s) {
      s = iv.max;
    }
    mins[i] = iv.min;
    best[i] = b;
    best_field[i] = bf;
    second[i] = s;
  }
  for (size_t k = 0; k < fields_.size(); ++k) {
    const Field& f = fields_[k];
    const int64_t lo = f.lo, hi = f.lo + f.count, a = f.source_field;
    if (f.count == 0) continue;
    const size_t p = std::lower_bound(mins.begin(), mins.end(), hi) - mins.begin();
    if (p == 0) continue;
    const int64_t other_max = best_field[p - 1] != a ? best[p - 1] : second[p - 1];
    if (other_max < lo) continue;
    int64_t culprit = source_.num_fields;  // the smallest such field, for the message
    for (const Interval& iv : intervals) {
      if (iv.field != a && iv.min < hi && iv.max >= lo) culprit = std::min(culprit, iv.field);
    }
    return Invalid("B field ", k, " takes A's unique ids [", lo, ", ", hi,
                   ") (those in the member rows [", f.source_offset, ", ",
                   f.source_offset + f.num_rows, ")) from A field ", a, ", but A field ", culprit,
                   " also looks up ids there (its inverse values span [", min_a_[culprit], ", ",
                   max_a_[culprit], "]). A fields ", a, " and ", culprit,
                   " share a member table, or source_offsets / num_rows of field ", k,
                   " do not match A's packing. Every member table of A that B reads must be "
                   "looked up by one field of A only; otherwise use unique_partition on B's "
                   "packed ids.");
  }
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
ImplStatus UniqueSubsetCpu<Id, Idx>::Prepare(const SourceResult<Id, Idx>& source,
                                             const FieldMap& map, const ParallelFor& parallel_for) {
  ImplStatus status = ValidateFieldMap<Id>(map);
  if (!status.ok()) return status;
  source_ = source;
  parallel_for_ = parallel_for;
  const int64_t fa = source.num_fields, na = source.num_positions;
  if (source.num_unique < 0 || na < 0 || fa < 0) return Invalid("negative input length.");

  // Positions of A's fields.
  std::vector<int64_t> pos_a(static_cast<size_t>(fa) + 1, 0);
  for (int64_t a = 0; a < fa; ++a) {
    const int64_t size = source.field_sizes[a];
    if (size < 0) {
      return Invalid("field_sizes[", a, "] = ", size,
                     " is negative; field_sizes holds the number of positions of every field of "
                     "A, in A's field order.");
    }
    if (size > na - pos_a[a]) {
      return Invalid("field_sizes sum to more than the ", na,
                     " positions of inverse (exceeded at field ", a,
                     "); field_sizes must list the positions of every field of A and sum to "
                     "the length of A's inverse.");
    }
    pos_a[a + 1] = pos_a[a] + size;
  }
  if (pos_a[fa] != na) {
    return Invalid("field_sizes sum to ", pos_a[fa], " but inverse has ", na,
                   " positions; field_sizes must list the positions of every field of A and sum "
                   "to the length of A's inverse.");
  }
  status = CheckAscending();
  if (!status.ok()) return status;

  const size_t fb = map.source_fields.size();
  fields_.assign(fb, Field());
  positions_.assign(fb + 1, 0);
  const Id* u = source.unique_ids;
  const int64_t ua = source.num_unique;
  auto lower_bound = [u, ua](int64_t value) {
    return std::lower_bound(u, u + ua, value,
                            [](Id x, int64_t v) { return static_cast<int64_t>(x) < v; }) -
           u;
  };
  for (size_t k = 0; k < fb; ++k) {
    Field& f = fields_[k];
    f.source_field = map.source_fields[k];
    if (f.source_field >= fa) {
      return Invalid("source_fields[", k, "] = ", f.source_field, " is out of range [0, ", fa,
                     "): A has ", fa, " fields (the length of field_sizes).");
    }
    f.source_offset = map.source_offsets[k];
    f.num_rows = map.num_rows[k];
    f.delta = map.target_offsets[k] - f.source_offset;
    f.lo = ua == 0 ? 0 : lower_bound(f.source_offset);
    f.count = (ua == 0 ? 0 : lower_bound(f.source_offset + f.num_rows)) - f.lo;
    f.source_pos = pos_a[f.source_field];
    f.size = source.field_sizes[f.source_field];
    if (f.size > kInt64Max - positions_[k]) return Invalid("B's positions overflow int64.");
    f.target_pos = positions_[k];
    positions_[k + 1] = positions_[k] + f.size;
  }
  num_positions_ = positions_[fb];

  InverseIntervals(pos_a);
  status = CheckInverseRanges();
  if (!status.ok()) return status;
  status = CheckAllInRange(pos_a);
  if (!status.ok()) return status;
  status = CheckExclusive();
  if (!status.ok()) return status;
  status = CheckUsed();
  if (!status.ok()) return status;

  by_target_.resize(fb);
  std::iota(by_target_.begin(), by_target_.end(), int64_t{0});
  std::sort(by_target_.begin(), by_target_.end(),
            [&](int64_t x, int64_t y) { return map.target_offsets[x] < map.target_offsets[y]; });
  starts_.assign(fb, 0);
  int64_t total = 0;
  for (size_t r = 0; r < fb; ++r) {
    Field& f = fields_[by_target_[r]];
    f.start = total;
    starts_[r] = total;
    total += f.count;
    if (total > std::numeric_limits<int32_t>::max()) {
      return Invalid("B would have more than 2^31 - 1 unique ids (partition_sizes is int32).");
    }
  }
  num_unique_ = total;
  return ImplStatus::Ok();
}

template <typename Id, typename Idx>
void UniqueSubsetCpu<Id, Idx>::Finish(Id* unique_ids, int32_t* partition_sizes, Idx* inverse,
                                      int64_t* field_sizes) {
  partition_sizes[0] = static_cast<int32_t>(num_unique_);
  for (size_t k = 0; k < fields_.size(); ++k) field_sizes[k] = fields_[k].size;

  // B's unique ids: every field's segment of A's, shifted, in target order.
  // The shifts wrap in unsigned arithmetic; the results fit Id (checked).
  using UId = std::make_unsigned_t<Id>;
  const Id* u = source_.unique_ids;
  parallel_for_(num_unique_, 2, [&](int64_t begin, int64_t end) {
    size_t r = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
    for (int64_t at = begin; at < end; ++r) {
      const Field& f = fields_[by_target_[r]];
      const int64_t stop = std::min(end, f.start + f.count);
      const Id* src = u + f.lo + (at - f.start);
      Id* dst = unique_ids + at;
      const UId delta = static_cast<UId>(static_cast<uint64_t>(f.delta));
      for (int64_t i = 0, len = stop - at; i < len; ++i) {
        dst[i] = static_cast<Id>(static_cast<UId>(src[i]) + delta);
      }
      at = std::max(at, stop);
    }
  });

  // B's inverse: A field a's values (all in [lo, lo + count), checked) shifted
  // to the field's segment of B's unique ids.
  using UIdx = std::make_unsigned_t<Idx>;
  parallel_for_(num_positions_, 2, [&](int64_t begin, int64_t end) {
    size_t k =
        std::upper_bound(positions_.begin(), positions_.end(), begin) - positions_.begin() - 1;
    for (int64_t at = begin; at < end; ++k) {
      const Field& f = fields_[k];
      const int64_t stop = std::min(end, f.target_pos + f.size);
      const Idx* src = source_.inverse + f.source_pos + (at - f.target_pos);
      Idx* dst = inverse + at;
      const UIdx shift = static_cast<UIdx>(static_cast<uint64_t>(f.start - f.lo));
      for (int64_t i = 0, len = stop - at; i < len; ++i) {
        dst[i] = static_cast<Idx>(static_cast<UIdx>(src[i]) + shift);
      }
      at = std::max(at, stop);
    }
  });
}

template ImplStatus ValidateFieldMap<int32_t>(const FieldMap& map);
template ImplStatus ValidateFieldMap<int64_t>(const FieldMap& map);
template class UniqueSubsetCpu<int32_t, int32_t>;
template class UniqueSubsetCpu<int32_t, int64_t>;
template class UniqueSubsetCpu<int64_t, int32_t>;
template class UniqueSubsetCpu<int64_t, int64_t>;

}  // namespace unique_subset
}  // namespace hybridtf
