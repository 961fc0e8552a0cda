// Distinct (member, id) pairs: one open-addressing pass per part (see the header).
#include "kernels/hybrid_hash/hybrid_hash_unique_impl.h"

#include <algorithm>
#include <string>
#include <unordered_map>

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

namespace {

constexpr uint64_t kKeptTableSlots = uint64_t{1} << 22;  // 16 MB: larger tables are freed

// The distinct pairs of fields [f0, f1), whose ids start at position begin;
// inverse[i] is the index among this range's pairs.
void UniqueFields(const int64_t* const* field_ids, int64_t begin, const int64_t* field_sizes,
                  const int64_t* field_members, int64_t f0, int64_t f1, int32_t* inverse,
                  MemberUnique* out) {
  int64_t n = 0;
  for (int64_t f = f0; f < f1; ++f) n += field_sizes[f];
  uint64_t capacity = 16;
  while (capacity < 2 * static_cast<uint64_t>(n)) capacity *= 2;  // n < 2^31: no overflow
  const uint64_t mask = capacity - 1;
  // Pair index or -1. Kept by the thread between calls: a fresh table of a
  // large part's size would be mapped and page-faulted in on every call.
  thread_local std::vector<int32_t> table;
  table.assign(capacity, -1);
  out->ids.reserve(static_cast<size_t>(n / 2));
  out->members.reserve(static_cast<size_t>(n / 2));
  out->counts.reserve(static_cast<size_t>(n / 2));
  int64_t i = begin;  // batch position of the field's id j
  for (int64_t f = f0; f < f1; ++f) {
    const int64_t member = field_members[f];
    const int64_t* ids = field_ids[f];
    for (int64_t j = 0; j < field_sizes[f]; ++j, ++i) {
      const int64_t id = ids[j];
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
  if (capacity > kKeptTableSlots) std::vector<int32_t>().swap(table);  // not kept when large
}

}  // namespace

void UniqueMemberFieldIds(const int64_t* const* field_ids, int64_t n, const int64_t* field_sizes,
                          const int64_t* field_members, int64_t num_fields, int32_t* inverse,
                          MemberUnique* out, const ParallelFor& pf) {
  // Parts: runs of whole fields of about kUniquePartIds ids that share no
  // member with any other part (a cut after field f only where every member of
  // fields [0, f] has its last field there or before). A pair then occurs in
  // one part only, so the parts' distinct pairs, concatenated in order, are
  // the batch's in order of first occurrence, whatever the thread count.
  std::vector<int64_t> cuts{0};
  if (n >= 2 * kUniquePartIds && num_fields > 1) {
    std::unordered_map<int64_t, int64_t> last;
    for (int64_t f = 0; f < num_fields; ++f) last[field_members[f]] = f;
    int64_t reach = 0, ids_in_part = 0;
    for (int64_t f = 0; f + 1 < num_fields; ++f) {
      reach = std::max(reach, last[field_members[f]]);
      ids_in_part += field_sizes[f];
      if (reach == f && ids_in_part >= kUniquePartIds) {
        cuts.push_back(f + 1);
        ids_in_part = 0;
      }
    }
  }
  cuts.push_back(num_fields);
  const int64_t parts = static_cast<int64_t>(cuts.size()) - 1;
  std::vector<int64_t> begin(static_cast<size_t>(parts + 1), 0);  // first id of each part
  for (int64_t p = 0; p < parts; ++p) {
    begin[p + 1] = begin[p];
    for (int64_t f = cuts[p]; f < cuts[p + 1]; ++f) begin[p + 1] += field_sizes[f];
  }
  if (parts == 1) {
    out->ids.clear();  // capacity kept: a caller may reuse out across calls
    out->members.clear();
    out->counts.clear();
    UniqueFields(field_ids, 0, field_sizes, field_members, 0, num_fields, inverse, out);
    return;
  }
  std::vector<MemberUnique> local(static_cast<size_t>(parts));
  pf(parts, 100 * kUniquePartIds, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      UniqueFields(field_ids, begin[p], field_sizes, field_members, cuts[p], cuts[p + 1], inverse,
                   &local[p]);
    }
  });
  std::vector<int64_t> offset(static_cast<size_t>(parts + 1), 0);
  for (int64_t p = 0; p < parts; ++p) {
    offset[p + 1] = offset[p] + static_cast<int64_t>(local[p].ids.size());
  }
  out->ids.resize(static_cast<size_t>(offset[parts]));
  out->members.resize(static_cast<size_t>(offset[parts]));
  out->counts.resize(static_cast<size_t>(offset[parts]));
  pf(parts, 10 * kUniquePartIds, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      std::copy(local[p].ids.begin(), local[p].ids.end(), out->ids.begin() + offset[p]);
      std::copy(local[p].members.begin(), local[p].members.end(), out->members.begin() + offset[p]);
      std::copy(local[p].counts.begin(), local[p].counts.end(), out->counts.begin() + offset[p]);
      const int32_t add = static_cast<int32_t>(offset[p]);
      for (int64_t i = begin[p]; i < begin[p + 1]; ++i) inverse[i] += add;
    }
  });
}

}  // namespace hybrid_hash
}  // namespace hybridtf
