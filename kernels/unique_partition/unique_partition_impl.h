// TF-free implementation layer of the fused Unique&Partition algorithm (CPU).
//
// Contract (shared by the CPU and CUDA implementations, the TF op and the
// pybind11 binding):
//
//   Given ids[0..n) and a partition function part(id) in [0, P):
//   * unique_ids holds every distinct id exactly once, grouped by partition in
//     ascending partition order; inside one partition the ids appear in the
//     order of their first occurrence in `ids` (or ascending with
//     spec.sorted). Hence the segment of partition p equals
//     tf.unique(ids[part(ids) == p]).y. The order is deterministic and does
//     not depend on the number of threads.
//   * partition_sizes[p] is the number of distinct ids owned by partition p
//     (these are the alltoall split sizes under model-parallel sharding).
//   * inverse[i] is the position of ids[i] in unique_ids, so
//     unique_ids[inverse] == ids.
//
// Partition functions:
//   * kModulo: part(id) = id mod P with a non-negative remainder (Python's %),
//     so negative (hashed) ids are allowed.
//   * kRange: contiguous ranges given by bounds[0..P] (bounds[0] == 0,
//     non-decreasing); part(id) = p with bounds[p] <= id < bounds[p+1]. Ids
//     must lie in [0, bounds[P]).
#ifndef HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_H_
#define HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace unique_partition {

constexpr int32_t kMaxPartitions = 4096;

enum class Strategy { kModulo = 0, kRange = 1 };

// Parses "mod" / "range"; returns false for anything else.
bool ParseStrategy(const std::string& name, Strategy* strategy);

// Describes how ids map to partitions. `bounds` points to num_partitions + 1
// host values for kRange and is ignored (may be null) for kModulo.
template <typename Id>
struct PartitionSpec {
  int32_t num_partitions = 1;
  Strategy strategy = Strategy::kModulo;
  const Id* bounds = nullptr;
  int64_t num_bounds = 0;
  // Order inside a partition: ascending id (true) instead of first occurrence
  // (false). Sorted output makes the gathers and sparse updates of a packed
  // table walk its rows in ascending order.
  bool sorted = false;
};

// Checks num_partitions and, for kRange, the bounds: length P + 1, first
// bound 0, non-decreasing. Used by every implementation before any work.
template <typename Id>
ImplStatus ValidateSpec(const PartitionSpec<Id>& spec);

// The error for ids[position] = id outside [0, limit) under kRange (negative
// or too large); shared by the CPU and CUDA layers so messages match.
ImplStatus BadRangeIdError(int64_t position, int64_t id, int64_t limit);

// Checks that n ids fit the int32 positions used internally.
ImplStatus ValidateLength(int64_t n);

// CPU implementation in two phases so that callers can allocate the
// data-dependent unique_ids output between them:
//
//   UniquePartitionCpu<int64_t> up;
//   ImplStatus s = up.Prepare(ids, n, spec);      // dedup, validate, count
//   if (!s.ok()) ...;
//   std::vector<int64_t> uniq(up.num_unique());
//   up.Finish(uniq.data(), sizes, inverse);          // sizes[P], inverse[n]
//
// The object holds O(n) scratch; reuse it across calls to avoid reallocation.
//
// Two algorithms give the same outputs. The hash path (above) handles every
// spec. The dense path handles sorted output with one partition or range
// partitions when the ids span a range of at most kDenseSpanPerId * n values
// (packed tables: ids are row numbers of a bounded table): a bitmap over
// [min, max] marks the ids, per-word prefix counts give every id its rank,
// which is its slot in the ascending unique_ids, and the set bits enumerate
// unique_ids already sorted. It needs no hash table and no sort, and its
// passes run on `parallel_for` (the ids must stay alive until Finish).
template <typename Id>
class UniquePartitionCpu {
 public:
  static constexpr int64_t kDenseSpanPerId = 256;
  static constexpr int64_t kMaxDenseSpan = int64_t{1} << 31;  // 256 MiB of bitmap

  ImplStatus Prepare(const Id* ids, int64_t n, const PartitionSpec<Id>& spec,
                     const ParallelFor& parallel_for = SequentialFor);
  int64_t num_unique() const { return num_unique_; }
  // Writes unique_ids[num_unique()], partition_sizes[num_partitions] and
  // inverse[n] (Idx is int32_t or int64_t). Call only after a successful
  // Prepare.
  template <typename Idx>
  void Finish(Id* unique_ids, int32_t* partition_sizes, Idx* inverse);

 private:
  struct Slot {
    Id key;
    int32_t uid;  // -1 marks an empty slot.
  };
  void Rehash(int64_t capacity);
  // uids in ascending id order (LSD radix sort over the differing bits).
  std::vector<int32_t> SortedUids() const;
  ImplStatus AssignPartition(Id id, int64_t position, int32_t* part) const;
  // Dense path: decides on [min, max] of the ids and, if taken, marks them.
  ImplStatus PrepareDense(const Id* ids, int64_t n, bool* taken);
  ImplStatus PrepareHash(const Id* ids, int64_t n);
  // Number of distinct ids < value (dense path; value clamped to the span).
  int64_t DenseRank(int64_t value) const;

  PartitionSpec<Id> spec_;
  int64_t n_ = 0;
  std::vector<Slot> table_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  std::vector<int32_t> first_uid_;  // per position: uid in first-seen order
  std::vector<Id> uid_ids_;         // per uid: the id
  std::vector<int32_t> uid_part_;   // per uid: partition, then output slot
  std::vector<int64_t> counts_;     // per partition
  int64_t num_unique_ = 0;

  // Dense path state.
  bool dense_ = false;
  ParallelFor parallel_for_ = SequentialFor;
  const Id* ids_ = nullptr;
  int64_t base_ = 0;                // smallest id
  int64_t span_ = 0;                // max - min + 1
  std::vector<uint64_t> bitmap_;    // bit (id - base_) set for every id
  std::vector<int64_t> word_rank_;  // distinct ids in the words before w
};

// One-shot convenience wrapper around UniquePartitionCpu (vectors out).
template <typename Id, typename Idx>
ImplStatus UniquePartitionToVectors(const Id* ids, int64_t n, const PartitionSpec<Id>& spec,
                                    std::vector<Id>* unique_ids,
                                    std::vector<int32_t>* partition_sizes,
                                    std::vector<Idx>* inverse);

}  // namespace unique_partition
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_IMPL_H_
