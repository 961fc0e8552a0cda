// The distinct (member, id) pairs of a packed HybridHash store's batch, in one
// pass (TF-free). Field f holds field_sizes[f] ids of member field_members[f];
// positions run over the fields in order. Pairs are kept in order of first
// occurrence with their occurrence counts, and inverse[i] is the index of
// position i's pair: what the store's lookup (unique ids, their members,
// counts) and StitchCombine (inverse) take.
#ifndef HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_UNIQUE_IMPL_H_
#define HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_UNIQUE_IMPL_H_

#include <cstdint>
#include <vector>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace hybrid_hash {

struct MemberUnique {
  std::vector<int64_t> ids;
  std::vector<int64_t> members;
  std::vector<int64_t> counts;
};

// InvalidArgument (nothing written) unless every field_sizes[f] >= 0, their sum
// (overflow-checked) is n, n < 2^31 (int32 inverse) and every field_members[f]
// is in [0, 2^20) (a store's member index).
ImplStatus CheckMemberFields(int64_t n, const int64_t* field_sizes, const int64_t* field_members,
                             int64_t num_fields);

// field_ids[f] points to field f's field_sizes[f] ids (the fields are never
// concatenated). Fills inverse[n] and out (its vectors' capacity is reused: a
// caller that keeps out between calls saves their allocation). Call
// CheckMemberFields first. Batches of at least 2 * kUniquePartIds ids are cut
// between fields into parts that share no member, deduplicated in parallel
// and concatenated: the same result.
constexpr int64_t kUniquePartIds = 8192;
void UniqueMemberFieldIds(const int64_t* const* field_ids, int64_t n, const int64_t* field_sizes,
                          const int64_t* field_members, int64_t num_fields, int32_t* inverse,
                          MemberUnique* out, const ParallelFor& pf);

}  // namespace hybrid_hash
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_HYBRID_HASH_HYBRID_HASH_UNIQUE_IMPL_H_
