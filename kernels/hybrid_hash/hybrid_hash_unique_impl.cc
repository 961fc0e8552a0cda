// Distinct (member, id) pairs: one open-addressing pass (see the header).
#include "kernels/hybrid_hash/hybrid_hash_unique_impl.h"

#include <string>

#include "kernels/hybrid_hash/hybrid_hash_impl.h"

namespace hybridtf {
namespace hybrid_hash {

namespace {

inline uint64_t PairHash(int64_t member, int64_t id) {  // splitmix64 of the pair
  uint64_t x = static_cast<uint64_t>(id) ^ (static_cast<uint64_t>(member) * 0xD6E8FEB86659FD93ull);
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

ImplStatus CheckMemberFields(int64_t n, const int64_t* field_sizes, const int64_t* field_members,
                             int64_t num_fields) {
  if (n < 0 || n > int64_t{0x7FFFFFFF}) {
    return ImplStatus::InvalidArgument(
        "HybridHash unique: " + std::to_string(n) +
        " ids do not fit an int32 inverse index (at most 2^31 - 1 per call). Split the batch.");
  }
  int64_t total = 0;
  for (int64_t f = 0; f < num_fields; ++f) {
    if (field_sizes[f] < 0) {
      return ImplStatus::InvalidArgument("HybridHash unique: field_sizes[" + std::to_string(f) +
                                         "] = " + std::to_string(field_sizes[f]) +
                                         " is negative. Pass the number of ids of each field.");
    }
    if (__builtin_add_overflow(total, field_sizes[f], &total)) {
      return ImplStatus::InvalidArgument(
          "HybridHash unique: the sum of field_sizes overflows int64. Pass the number of ids of "
          "each field.");
    }
    if (field_members[f] < 0 || field_members[f] >= kMaxMembers) {
      return ImplStatus::InvalidArgument(
          "HybridHash unique: field_members[" + std::to_string(f) +
          "] = " + std::to_string(field_members[f]) + " is not a member index (0 <= member < " +
          std::to_string(kMaxMembers) + "). Pass each field's table index in its store.");
    }
  }
  if (total != n) {
    return ImplStatus::InvalidArgument(
        "HybridHash unique: field_sizes sum to " + std::to_string(total) + " but there are " +
        std::to_string(n) + " ids. Pass one size per field, in the ids' order.");
  }
  return ImplStatus::Ok();
}

void UniqueMemberIds(const int64_t* ids, int64_t n, const int64_t* field_sizes,
                     const int64_t* field_members, int64_t num_fields, int32_t* inverse,
                     MemberUnique* out) {
  out->ids.clear();
  out->members.clear();
  out->counts.clear();
  uint64_t capacity = 16;
  while (capacity < 2 * static_cast<uint64_t>(n)) capacity *= 2;  // n < 2^31: no overflow
  const uint64_t mask = capacity - 1;
  std::vector<int32_t> table(capacity, -1);  // pair index or -1
  int64_t i = 0;
  for (int64_t f = 0; f < num_fields; ++f) {
    const int64_t member = field_members[f];
    for (const int64_t end = i + field_sizes[f]; i < end; ++i) {
      const int64_t id = ids[i];
      uint64_t s = PairHash(member, id) & mask;
      for (;; s = (s + 1) & mask) {
        const int32_t k = table[s];
        if (k < 0) {
          const int32_t fresh = static_cast<int32_t>(out->ids.size());
          table[s] = fresh;
          out->ids.push_back(id);
          out->members.push_back(member);
          out->counts.push_back(1);
          inverse[i] = fresh;
          break;
        }
        if (out->ids[k] == id && out->members[k] == member) {
          ++out->counts[k];
          inverse[i] = k;
          break;
        }
      }
    }
  }
}

}  // namespace hybrid_hash
}  // namespace hybridtf
