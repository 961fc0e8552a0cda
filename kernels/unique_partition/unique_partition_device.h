// The per-index bodies of the CUDA Unique&Partition kernels
// (unique_partition_impl.cu, one index per thread), shared with host loops:
// the harness unique_partition_impl_test.cu runs the same functions on the
// CPU, with std::stable_sort and std::inclusive_scan in place of CUB's stable
// radix sort and scan, and compares the result with the CPU layer, so a
// machine without a GPU still checks the GPU algorithm. No CUDA or TensorFlow
// headers.
#ifndef HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_DEVICE_H_
#define HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_DEVICE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define HYBRIDTF_UP_HD __host__ __device__
#else
#define HYBRIDTF_UP_HD
#endif

namespace hybridtf {
namespace unique_partition {
namespace device {

// Atomics on the device; plain operations in a host loop (one index at a time).
HYBRIDTF_UP_HD inline void AtomicMinInt32(int32_t* where, int32_t value) {
#if defined(__CUDA_ARCH__)
  atomicMin(where, value);
#else
  if (value < *where) *where = value;
#endif
}

HYBRIDTF_UP_HD inline void AtomicAddInt32(int32_t* where, int32_t value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(where, value);
#else
  *where += value;
#endif
}

// heads[j]: 1 where the sorted ids start a new value.
template <typename Id>
HYBRIDTF_UP_HD inline void MarkHead(const Id* sorted, int64_t j, int32_t* heads) {
  heads[j] = (j == 0 || sorted[j] != sorted[j - 1]) ? 1 : 0;
}

// The partition that owns `id`; false for an id outside the range bounds.
template <typename Id>
HYBRIDTF_UP_HD inline bool Owner(Id id, int32_t num_partitions, bool range, const Id* bounds,
                                 int32_t* owner) {
  if (!range) {
    int64_t r = static_cast<int64_t>(id) % num_partitions;
    if (r < 0) r += num_partitions;
    *owner = static_cast<int32_t>(r);
    return true;
  }
  if (id < 0 || id >= bounds[num_partitions]) return false;
  // First p in [0, P) with id < bounds[p + 1] (upper_bound on bounds[1..P]).
  int32_t lo = 0, hi = num_partitions - 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (id < bounds[mid + 1]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  *owner = lo;
  return true;
}

// Everything one sorted position contributes in step 3 of the algorithm
// (unique_partition_impl_cuda.h): the number of uniques (last position), and
// at a segment's head the unique's id, its owner/rank sort key, its owner's
// count and, for an id outside the range bounds, the first bad position.
template <typename Id>
struct CollectArgs {
  const Id* sorted;
  const int32_t* sorted_pos;
  const int32_t* heads;
  const int32_t* segment;
  int64_t n;
  int32_t num_partitions;
  bool range;
  bool sorted_order;
  const Id* bounds;
  Id* uniq;
  uint64_t* keys;
  int32_t* counts;
  int32_t* num_unique;
  int32_t* first_bad_position;
};

template <typename Id>
HYBRIDTF_UP_HD inline void CollectUnique(const CollectArgs<Id>& a, int64_t j) {
  if (j == a.n - 1) *a.num_unique = a.segment[j];
  if (!a.heads[j]) return;
  const int32_t u = a.segment[j] - 1;
  const Id id = a.sorted[j];
  const int32_t first_pos = a.sorted_pos[j];  // stable sort: the first occurrence
  int32_t owner = 0;
  if (!Owner(id, a.num_partitions, a.range, a.bounds, &owner)) {
    AtomicMinInt32(a.first_bad_position, first_pos);
    owner = 0;
  }
  a.uniq[u] = id;
  // Inside an owner: first-occurrence order, or id order (u ranks the ids).
  const uint32_t rank =
      a.sorted_order ? static_cast<uint32_t>(u) : static_cast<uint32_t>(first_pos);
  a.keys[u] = (static_cast<uint64_t>(owner) << 32) | rank;
  AtomicAddInt32(&a.counts[owner], 1);
}

// Output slot k takes the unique order[k]; slot[u] remembers where it went.
template <typename Id>
HYBRIDTF_UP_HD inline void ScatterUnique(const int32_t* order, const Id* uniq, int64_t k, Id* out,
                                         int32_t* slot) {
  const int32_t u = order[k];
  out[k] = uniq[u];
  slot[u] = static_cast<int32_t>(k);
}

template <typename Idx>
HYBRIDTF_UP_HD inline void Inverse(const int32_t* sorted_pos, const int32_t* segment,
                                   const int32_t* slot, int64_t j, Idx* inverse) {
  inverse[sorted_pos[j]] = static_cast<Idx>(slot[segment[j] - 1]);
}

// The owner/rank keys' sort covers the 32 rank bits and as many owner bits as
// num_partitions - 1 needs.
inline int KeyEndBit(int32_t num_partitions) {
  int bits = 0;
  while ((int64_t{1} << bits) <= int64_t{num_partitions} - 1) ++bits;
  return 32 + bits;
}

}  // namespace device
}  // namespace unique_partition
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_DEVICE_H_
