// CPU implementation of the fused Unique&Partition algorithm. See
// unique_partition_impl.h for the contract.
//
// One pass over the ids with an open-addressing hash table (linear probing,
// Fibonacci hashing, load factor <= 1/2, grown on demand so that it stays
// cache-sized for skewed ids) assigns each distinct id a uid in first-seen
// order and counts distinct ids per partition. The partition of an id is
// computed, and the id validated, once per distinct id. A second pass places
// uids into their partition segment (a counting sort, which preserves
// first-seen order inside a partition) and a third maps every position to its
// output slot.
#include "kernels/unique_partition/unique_partition_impl.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "kernels/common/multiversion.h"

namespace hybridtf {
namespace unique_partition {

namespace {

// inverse[i] = rank of ids[i] among the bitmap's set bits, for i in [first, last).
template <typename Id, typename Idx>
HYBRIDTF_MULTIVERSION_POPCNT void DenseInverse(const Id* ids, int64_t first, int64_t last,
                                               uint64_t base, const int64_t* rank,
                                               const uint64_t* bits, Idx* inverse) {
  for (int64_t i = first; i < last; ++i) {
    const uint64_t offset = static_cast<uint64_t>(static_cast<int64_t>(ids[i])) - base;
    const uint64_t below = (uint64_t{1} << (offset & 63)) - 1;
    inverse[i] =
        static_cast<Idx>(rank[offset >> 6] + __builtin_popcountll(bits[offset >> 6] & below));
  }
}

constexpr uint64_t kFibonacci = 0x9E3779B97F4A7C15ull;
constexpr int64_t kMinCapacity = 1024;
constexpr int64_t kMaxInitialCapacity = int64_t{1} << 16;

template <typename Id>
inline uint64_t HashBits(Id id) {
  return static_cast<uint64_t>(static_cast<int64_t>(id)) * kFibonacci;
}

int Log2(int64_t power_of_two) {
  int log = 0;
  while ((int64_t{1} << log) < power_of_two) ++log;
  return log;
}

}  // namespace

bool ParseStrategy(const std::string& name, Strategy* strategy) {
  if (name == "mod") {
    *strategy = Strategy::kModulo;
    return true;
  }
  if (name == "range") {
    *strategy = Strategy::kRange;
    return true;
  }
  return false;
}

template <typename Id>
ImplStatus ValidateSpec(const PartitionSpec<Id>& spec) {
  const int32_t p = spec.num_partitions;
  if (p < 1 || p > kMaxPartitions) {
    return ImplStatus::InvalidArgument(
        "num_partitions must be in [1, " + std::to_string(kMaxPartitions) + "], got " +
        std::to_string(p) + ". Use the number of ranks that own embedding shards.");
  }
  if (spec.strategy == Strategy::kModulo) {
    if (spec.num_bounds != 0) {
      return ImplStatus::InvalidArgument(
          "range_bounds must be empty for strategy 'mod', got " + std::to_string(spec.num_bounds) +
          " values. Pass strategy='range' to partition by contiguous ranges.");
    }
    return ImplStatus::Ok();
  }
  if (spec.bounds == nullptr || spec.num_bounds != int64_t{p} + 1) {
    return ImplStatus::InvalidArgument(
        "strategy 'range' with num_partitions=" + std::to_string(p) +
        " needs num_partitions + 1 = " + std::to_string(int64_t{p} + 1) + " range_bounds, got " +
        std::to_string(spec.num_bounds) +
        ". Build them with hybridtf.ops.even_range_bounds(num_rows, "
        "num_partitions).");
  }
  if (spec.bounds[0] != 0) {
    return ImplStatus::InvalidArgument(
        "range_bounds[0] must be 0 (ranges cover [0, num_rows)), got " +
        std::to_string(static_cast<int64_t>(spec.bounds[0])) + ".");
  }
  for (int32_t i = 0; i < p; ++i) {
    if (spec.bounds[i] > spec.bounds[i + 1]) {
      return ImplStatus::InvalidArgument(
          "range_bounds must be non-decreasing, but range_bounds[" + std::to_string(i) +
          "] = " + std::to_string(static_cast<int64_t>(spec.bounds[i])) + " > range_bounds[" +
          std::to_string(i + 1) +
          "] = " + std::to_string(static_cast<int64_t>(spec.bounds[i + 1])) + ".");
    }
  }
  return ImplStatus::Ok();
}

ImplStatus ValidateLength(int64_t n) {
  // Positions are tracked as int32 internally whatever the output index type.
  if (n > std::numeric_limits<int32_t>::max()) {
    return ImplStatus::InvalidArgument(
        "ids has " + std::to_string(n) +
        " elements; UniquePartition handles at most 2^31 - 1 ids per call. "
        "Split the batch into micro-batches.");
  }
  return ImplStatus::Ok();
}

ImplStatus BadRangeIdError(int64_t position, int64_t id, int64_t limit) {
  const std::string where = "ids[" + std::to_string(position) + "] = " + std::to_string(id);
  if (id < 0) {
    return ImplStatus::InvalidArgument(
        where + " is negative, but strategy 'range' needs ids in [0, " + std::to_string(limit) +
        "). Use strategy 'mod' for hashed ids, or map ids into the table's "
        "vocabulary first.");
  }
  return ImplStatus::InvalidArgument(
      where + " is out of range: strategy 'range' covers ids in [0, " + std::to_string(limit) +
      ") (range_bounds[-1]). Check the table's vocabulary size.");
}

template <typename Id>
ImplStatus UniquePartitionCpu<Id>::AssignPartition(Id id, int64_t position, int32_t* part) const {
  const int32_t p = spec_.num_partitions;
  if (spec_.strategy == Strategy::kModulo) {
    int64_t r = static_cast<int64_t>(id) % p;
    if (r < 0) r += p;
    *part = static_cast<int32_t>(r);
    return ImplStatus::Ok();
  }
  const Id limit = spec_.bounds[p];
  if (id < 0 || id >= limit) {
    return BadRangeIdError(position, static_cast<int64_t>(id), static_cast<int64_t>(limit));
  }
  const Id* first = spec_.bounds + 1;
  const Id* last = spec_.bounds + p + 1;
  *part = static_cast<int32_t>(std::upper_bound(first, last, id) - first);
  return ImplStatus::Ok();
}

template <typename Id>
void UniquePartitionCpu<Id>::Rehash(int64_t capacity) {
  table_.assign(static_cast<size_t>(capacity), Slot{Id(0), -1});
  mask_ = static_cast<uint64_t>(capacity - 1);
  shift_ = 64 - Log2(capacity);
  const int32_t count = static_cast<int32_t>(uid_ids_.size());
  for (int32_t uid = 0; uid < count; ++uid) {
    uint64_t h = HashBits(uid_ids_[uid]) >> shift_;
    while (table_[h].uid >= 0) h = (h + 1) & mask_;
    table_[h] = Slot{uid_ids_[uid], uid};
  }
}

template <typename Id>
ImplStatus UniquePartitionCpu<Id>::Prepare(const Id* ids, int64_t n, const PartitionSpec<Id>& spec,
                                           const ParallelFor& parallel_for) {
  ImplStatus status = ValidateSpec(spec);
  if (!status.ok()) return status;
  status = ValidateLength(n);
  if (!status.ok()) return status;
  spec_ = spec;
  n_ = n;
  ids_ = ids;
  parallel_for_ = parallel_for;
  dense_ = false;
  num_unique_ = 0;
  counts_.assign(static_cast<size_t>(spec.num_partitions), 0);
  if (spec.sorted && n > 0 && (spec.num_partitions == 1 || spec.strategy == Strategy::kRange)) {
    bool taken = false;
    status = PrepareDense(ids, n, &taken);
    if (!status.ok() || taken) return status;
  }
  return PrepareHash(ids, n);
}

template <typename Id>
ImplStatus UniquePartitionCpu<Id>::PrepareDense(const Id* ids, int64_t n, bool* taken) {
  // Smallest and largest id, over fixed chunks (the result does not depend on threads).
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, n / 16384));
  std::vector<int64_t> lo(static_cast<size_t>(chunks)), hi(static_cast<size_t>(chunks));
  parallel_for_(chunks, 2 * (n / chunks), [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
      Id mn = ids[begin], mx = ids[begin];
      for (int64_t i = begin + 1; i < end; ++i) {
        mn = std::min(mn, ids[i]);
        mx = std::max(mx, ids[i]);
      }
      lo[c] = static_cast<int64_t>(mn);
      hi[c] = static_cast<int64_t>(mx);
    }
  });
  const int64_t min_id = *std::min_element(lo.begin(), lo.end());
  const int64_t max_id = *std::max_element(hi.begin(), hi.end());
  if (spec_.strategy == Strategy::kRange) {
    const int64_t limit = static_cast<int64_t>(spec_.bounds[spec_.num_partitions]);
    if (min_id < 0 || max_id >= limit) {  // the first bad position, as the hash path reports it
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = static_cast<int64_t>(ids[i]);
        if (id < 0 || id >= limit) return BadRangeIdError(i, id, limit);
      }
    }
  }
  // max - min computed without signed overflow.
  const uint64_t width = static_cast<uint64_t>(max_id) - static_cast<uint64_t>(min_id);
  if (width >= static_cast<uint64_t>(kMaxDenseSpan) ||
      width >= static_cast<uint64_t>(kDenseSpanPerId * n)) {
    return ImplStatus::Ok();  // too sparse: the hash path
  }
  *taken = true;
  dense_ = true;
  base_ = min_id;
  span_ = static_cast<int64_t>(width) + 1;
  const int64_t words = (span_ + 63) / 64;
  bitmap_.assign(static_cast<size_t>(words), 0);
  uint64_t* bits = bitmap_.data();
  const uint64_t base = static_cast<uint64_t>(base_);
  // Each chunk of positions spans only the words between its smallest and
  // largest id. When those spans hardly overlap (packed ids are field after
  // field, so a chunk covers a few fields' rows), every chunk marks its ids in
  // a private bitmap of its span with plain stores, and the spans are then
  // ORed into the shared bitmap: no atomic read-modify-writes. Otherwise the
  // chunks mark the shared bitmap atomically. The same set of bits either way.
  std::vector<int64_t> span_first(static_cast<size_t>(chunks)), span_offset(chunks + 1, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    span_first[c] = (lo[c] - min_id) >> 6;
    span_offset[c + 1] = span_offset[c] + ((hi[c] - min_id) >> 6) - span_first[c] + 1;
  }
  if (chunks > 1 && span_offset[chunks] <= 2 * words + chunks) {
    std::unique_ptr<uint64_t[]> private_bits(new uint64_t[span_offset[chunks]]);
    parallel_for_(chunks, 4 * (n / chunks), [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        uint64_t* mine = private_bits.get() + span_offset[c];
        std::fill(mine, mine + (span_offset[c + 1] - span_offset[c]), uint64_t{0});
        const uint64_t origin = base + 64 * static_cast<uint64_t>(span_first[c]);
        for (int64_t i = n * c / chunks, end = n * (c + 1) / chunks; i < end; ++i) {
          const uint64_t offset = static_cast<uint64_t>(static_cast<int64_t>(ids[i])) - origin;
          mine[offset >> 6] |= uint64_t{1} << (offset & 63);
        }
      }
    });
    parallel_for_(words, 2 * chunks, [&](int64_t first, int64_t last) {
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t len = span_offset[c + 1] - span_offset[c];
        const int64_t a = std::max(first, span_first[c]), b = std::min(last, span_first[c] + len);
        const uint64_t* mine = private_bits.get() + span_offset[c];
        for (int64_t w = a; w < b; ++w) bits[w] |= mine[w - span_first[c]];
      }
    });
  } else {
    parallel_for_(n, 6, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        const uint64_t offset = static_cast<uint64_t>(static_cast<int64_t>(ids[i])) - base;
        const uint64_t mask = uint64_t{1} << (offset & 63);
        uint64_t* word = bits + (offset >> 6);
        if ((__atomic_load_n(word, __ATOMIC_RELAXED) & mask) == 0) {
          __atomic_fetch_or(word, mask, __ATOMIC_RELAXED);
        }
      }
    });
  }
  word_rank_.resize(static_cast<size_t>(words) + 1);
  int64_t total = 0;
  for (int64_t w = 0; w < words; ++w) {
    word_rank_[w] = total;
    total += __builtin_popcountll(bits[w]);
  }
  word_rank_[words] = total;
  num_unique_ = total;
  if (spec_.num_partitions == 1) {
    counts_[0] = total;
  } else {  // range partitions: ascending ids are already grouped by owner
    for (int32_t q = 0; q < spec_.num_partitions; ++q) {
      counts_[q] = DenseRank(static_cast<int64_t>(spec_.bounds[q + 1])) -
                   DenseRank(static_cast<int64_t>(spec_.bounds[q]));
    }
  }
  return ImplStatus::Ok();
}

template <typename Id>
int64_t UniquePartitionCpu<Id>::DenseRank(int64_t value) const {
  if (value <= base_) return 0;
  const uint64_t offset = static_cast<uint64_t>(value) - static_cast<uint64_t>(base_);
  if (offset >= static_cast<uint64_t>(span_)) return num_unique_;
  const uint64_t below = (uint64_t{1} << (offset & 63)) - 1;
  return word_rank_[offset >> 6] + __builtin_popcountll(bitmap_[offset >> 6] & below);
}

template <typename Id>
ImplStatus UniquePartitionCpu<Id>::PrepareHash(const Id* ids, int64_t n) {
  ImplStatus status = ImplStatus::Ok();
  first_uid_.resize(static_cast<size_t>(n));
  uid_ids_.clear();
  uid_part_.clear();

  int64_t capacity = kMinCapacity;
  while (capacity < std::min<int64_t>(2 * n, kMaxInitialCapacity)) {
    capacity *= 2;
  }
  Rehash(capacity);

  constexpr int64_t kPrefetchDistance = 16;  // hide the latency of random slot reads
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      __builtin_prefetch(&table_[HashBits(ids[i + kPrefetchDistance]) >> shift_]);
    }
    const Id id = ids[i];
    uint64_t h = HashBits(id) >> shift_;
    for (;;) {
      Slot& slot = table_[h];
      if (slot.uid < 0) {
        int32_t part = 0;
        status = AssignPartition(id, i, &part);
        if (!status.ok()) return status;
        const int32_t uid = static_cast<int32_t>(uid_ids_.size());
        slot = Slot{id, uid};
        uid_ids_.push_back(id);
        uid_part_.push_back(part);
        ++counts_[part];
        first_uid_[i] = uid;
        if (2 * (int64_t{uid} + 1) > static_cast<int64_t>(table_.size())) {
          Rehash(2 * static_cast<int64_t>(table_.size()));
        }
        break;
      }
      if (slot.key == id) {
        first_uid_[i] = slot.uid;
        break;
      }
      h = (h + 1) & mask_;
    }
  }
  num_unique_ = static_cast<int64_t>(uid_ids_.size());
  return ImplStatus::Ok();
}

template <typename Id>
std::vector<int32_t> UniquePartitionCpu<Id>::SortedUids() const {
  const size_t count = uid_ids_.size();
  std::vector<int32_t> order(count), scratch(count);
  std::vector<uint64_t> keys(count);
  uint64_t lo = ~uint64_t{0}, hi = 0;
  for (size_t u = 0; u < count; ++u) {
    // Flip the sign bit so that unsigned order is signed id order.
    keys[u] = static_cast<uint64_t>(static_cast<int64_t>(uid_ids_[u])) ^ (uint64_t{1} << 63);
    lo = std::min(lo, keys[u]);
    hi = std::max(hi, keys[u]);
    order[u] = static_cast<int32_t>(u);
  }
  int bits = 0;  // bits above the highest differing bit are equal for all keys
  for (uint64_t diff = count ? (lo ^ hi) : 0; diff != 0; diff >>= 1) ++bits;
  constexpr int kDigit = 16;
  std::vector<uint32_t> histogram(size_t{1} << kDigit);
  for (int shift = 0; shift < bits; shift += kDigit) {
    std::fill(histogram.begin(), histogram.end(), 0);
    for (size_t i = 0; i < count; ++i) ++histogram[(keys[order[i]] >> shift) & 0xFFFF];
    uint32_t sum = 0;
    for (uint32_t& h : histogram) {
      const uint32_t c = h;
      h = sum;
      sum += c;
    }
    for (size_t i = 0; i < count; ++i) {
      scratch[histogram[(keys[order[i]] >> shift) & 0xFFFF]++] = order[i];
    }
    order.swap(scratch);
  }
  return order;
}

template <typename Id>
template <typename Idx>
void UniquePartitionCpu<Id>::Finish(Id* unique_ids, int32_t* partition_sizes, Idx* inverse) {
  const int32_t p = spec_.num_partitions;
  if (dense_) {
    for (int32_t q = 0; q < p; ++q) partition_sizes[q] = static_cast<int32_t>(counts_[q]);
    const uint64_t* bits = bitmap_.data();
    const int64_t* rank = word_rank_.data();
    const int64_t base = base_;
    parallel_for_(static_cast<int64_t>(bitmap_.size()), 64, [&](int64_t first, int64_t last) {
      for (int64_t w = first; w < last; ++w) {
        int64_t slot = rank[w];
        for (uint64_t x = bits[w]; x != 0; x &= x - 1) {
          unique_ids[slot++] = static_cast<Id>(base + w * 64 + __builtin_ctzll(x));
        }
      }
    });
    const Id* ids = ids_;
    const uint64_t ubase = static_cast<uint64_t>(base);
    parallel_for_(n_, 8, [&](int64_t first, int64_t last) {
      DenseInverse(ids, first, last, ubase, rank, bits, inverse);
    });
    return;
  }
  std::vector<int64_t> cursor(static_cast<size_t>(p));
  int64_t offset = 0;
  for (int32_t q = 0; q < p; ++q) {
    cursor[q] = offset;
    partition_sizes[q] = static_cast<int32_t>(counts_[q]);
    offset += counts_[q];
  }
  const int32_t count = static_cast<int32_t>(uid_ids_.size());
  if (spec_.sorted) {
    for (const int32_t uid : SortedUids()) {
      const int64_t slot = cursor[uid_part_[uid]]++;
      unique_ids[slot] = uid_ids_[uid];
      uid_part_[uid] = static_cast<int32_t>(slot);
    }
  } else {
    for (int32_t uid = 0; uid < count; ++uid) {
      const int64_t slot = cursor[uid_part_[uid]]++;
      unique_ids[slot] = uid_ids_[uid];
      uid_part_[uid] = static_cast<int32_t>(slot);  // now: uid -> output slot
    }
  }
  const int32_t* first_uid = first_uid_.data();
  const int32_t* slot_of = uid_part_.data();
  for (int64_t i = 0; i < n_; ++i) {
    inverse[i] = static_cast<Idx>(slot_of[first_uid[i]]);
  }
}

template <typename Id, typename Idx>
ImplStatus UniquePartitionToVectors(const Id* ids, int64_t n, const PartitionSpec<Id>& spec,
                                    std::vector<Id>* unique_ids,
                                    std::vector<int32_t>* partition_sizes,
                                    std::vector<Idx>* inverse) {
  UniquePartitionCpu<Id> up;
  ImplStatus status = up.Prepare(ids, n, spec);
  if (!status.ok()) return status;
  unique_ids->resize(static_cast<size_t>(up.num_unique()));
  partition_sizes->resize(static_cast<size_t>(spec.num_partitions));
  inverse->resize(static_cast<size_t>(n));
  up.Finish(unique_ids->data(), partition_sizes->data(), inverse->data());
  return ImplStatus::Ok();
}

#define HYBRIDTF_INSTANTIATE_ID(Id)                                                          \
  template ImplStatus ValidateSpec<Id>(const PartitionSpec<Id>&);                            \
  template class UniquePartitionCpu<Id>;                                                     \
  template void UniquePartitionCpu<Id>::Finish<int32_t>(Id*, int32_t*, int32_t*);            \
  template void UniquePartitionCpu<Id>::Finish<int64_t>(Id*, int32_t*, int64_t*);            \
  template ImplStatus UniquePartitionToVectors<Id, int32_t>(                                 \
      const Id*, int64_t, const PartitionSpec<Id>&, std::vector<Id>*, std::vector<int32_t>*, \
      std::vector<int32_t>*);                                                                \
  template ImplStatus UniquePartitionToVectors<Id, int64_t>(                                 \
      const Id*, int64_t, const PartitionSpec<Id>&, std::vector<Id>*, std::vector<int32_t>*, \
      std::vector<int64_t>*);

HYBRIDTF_INSTANTIATE_ID(int32_t)
HYBRIDTF_INSTANTIATE_ID(int64_t)
#undef HYBRIDTF_INSTANTIATE_ID

}  // namespace unique_partition
}  // namespace hybridtf
