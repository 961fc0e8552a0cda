// TF-free implementation layer of UniqueSubset (CPU): one packed table's
// sorted UniquePartition result derived from another's, without the ids.
//
// Setting: packed table A's rows are the concatenation of member tables;
// A's packed ids are the concatenation, field by field, of each field's ids
// plus the packed row offset of that field's member table, and A's result is
// UniquePartition(packed_ids_A, num_partitions=1, sorted=true). Packed table B
// looks up the same id tensors (a subset of A's fields, in any order) in its
// own packed row space. Then B's result is a relabelling of a part of A's:
//
//   * B field k reads A field a = source_fields[k]; A field a's member table
//     starts at source_offsets[k] in A, B field k's at target_offsets[k] in B,
//     both with num_rows[k] rows.
//   * The unique ids of A inside [source_offsets[k], + num_rows[k]) are
//     unique_ids[lo_k, hi_k) (A's unique ids are ascending). Shifted by
//     target_offsets[k] - source_offsets[k] they are B field k's unique ids.
//   * B's target ranges are disjoint, so ordering the B fields by target
//     offset and concatenating their segments gives B's ascending unique ids;
//     start_k is the number of unique ids of the fields placed before k.
//   * B's positions are its fields in B order; position j of B field k is
//     position j of A field a, and its inverse is inverse_A - lo_k + start_k.
//
// The result equals UniquePartition(packed_ids_B, 1, sorted=true) bit for bit
// when every id of A inside field k's member range comes from A field a. That
// is checked, not assumed, from the interval [min, max] of every A field's
// inverse values: A field a's must lie in [lo_k, hi_k), and no other A field's
// may meet [lo_k, hi_k) (one does when it shares the member table, or when the
// offsets / num_rows do not match A's packing). With A's result coming from
// one UniquePartition (every unique id is used by some position), that proves
// every unique id of the segment is used by field a. A shared member table is
// rejected whenever the other field has positions, not only when the results
// would differ, so the error does not come and go with the batch's ids.
//
// All passes that touch O(n) data run on the ParallelFor; the outputs do not
// depend on the number of threads.
#ifndef HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_SUBSET_IMPL_H_
#define HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_SUBSET_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace unique_subset {

// How B's fields map onto A's (the op's attrs); all four have one entry per B
// field.
struct FieldMap {
  std::vector<int64_t> source_fields;   // A field read by B field k
  std::vector<int64_t> source_offsets;  // that A field's member table offset in A
  std::vector<int64_t> target_offsets;  // B field k's member table offset in B
  std::vector<int64_t> num_rows;        // rows of that member table
};

// Checks what does not depend on the inputs: equal lengths >= 1, offsets >= 0,
// num_rows >= 1, no int64 overflow, B's ids fit Id, pairwise disjoint target
// ranges. Called once by the kernel constructor and again by Prepare.
template <typename Id>
ImplStatus ValidateFieldMap(const FieldMap& map);

// A's UniquePartition(sorted) result and field layout.
template <typename Id, typename Idx>
struct SourceResult {
  const Id* unique_ids = nullptr;  // [num_unique], strictly ascending
  int64_t num_unique = 0;
  const Idx* inverse = nullptr;  // [num_positions]
  int64_t num_positions = 0;
  const int64_t* field_sizes = nullptr;  // [num_fields], summing to num_positions
  int64_t num_fields = 0;
};

// Two phases so that the caller can allocate the data-dependent outputs in
// between:
//
//   UniqueSubsetCpu<int64_t, int32_t> subset;
//   ImplStatus s = subset.Prepare(source, map, parallel_for);
//   if (!s.ok()) ...;
//   // allocate unique_ids[num_unique()], inverse[num_positions()],
//   // partition_sizes[1], field_sizes[num_fields()]
//   subset.Finish(unique_ids, partition_sizes, inverse, field_sizes);
//
// Prepare does every check; Finish cannot fail (call it only after a
// successful Prepare). The source arrays must stay alive until Finish returns.
template <typename Id, typename Idx>
class UniqueSubsetCpu {
 public:
  ImplStatus Prepare(const SourceResult<Id, Idx>& source, const FieldMap& map,
                     const ParallelFor& parallel_for = SequentialFor);
  int64_t num_unique() const { return num_unique_; }
  int64_t num_positions() const { return num_positions_; }
  int64_t num_fields() const { return static_cast<int64_t>(fields_.size()); }
  void Finish(Id* unique_ids, int32_t* partition_sizes, Idx* inverse, int64_t* field_sizes);

 private:
  struct Field {
    int64_t source_field = 0;
    int64_t source_offset = 0;
    int64_t num_rows = 0;
    int64_t delta = 0;       // target_offset - source_offset
    int64_t lo = 0;          // first index into A's unique_ids
    int64_t count = 0;       // unique ids of the field
    int64_t start = 0;       // first index into B's unique_ids
    int64_t source_pos = 0;  // first position of A field source_field
    int64_t target_pos = 0;  // first position of B field k
    int64_t size = 0;        // positions of the field
  };
  ImplStatus CheckAscending() const;
  // min/max of every A field's inverse values (fields of size 0 left out).
  void InverseIntervals(const std::vector<int64_t>& pos_a);
  // The inverse values of the A fields B does not read in [0, num_unique).
  ImplStatus CheckAllInRange(const std::vector<int64_t>& pos_a) const;
  ImplStatus CheckInverseRanges() const;
  // Every unique id of every B field's segment used by its A field.
  ImplStatus CheckUsed() const;
  ImplStatus CheckExclusive() const;

  SourceResult<Id, Idx> source_;
  ParallelFor parallel_for_ = SequentialFor;
  std::vector<Field> fields_;           // in B order
  std::vector<int64_t> by_target_;      // B field indices in ascending target offset
  std::vector<int64_t> starts_;         // fields_[by_target_[r]].start, ascending
  std::vector<int64_t> positions_;      // fields_[k].target_pos, ascending, + total
  std::vector<int64_t> min_a_, max_a_;  // per A field: interval of its inverse values
  int64_t num_unique_ = 0;
  int64_t num_positions_ = 0;
};

}  // namespace unique_subset
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_SUBSET_IMPL_H_
