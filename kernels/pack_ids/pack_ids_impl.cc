// CPU implementation of PackIds. See pack_ids_impl.h.
#include "kernels/pack_ids/pack_ids_impl.h"

#include "kernels/common/checked_math.h"

namespace hybridtf {
namespace pack_ids {

ImplStatus ValidateTable(int64_t row_offset, int64_t num_rows, const std::string& table) {
  if (row_offset < 0 || num_rows < 0) {
    return ImplStatus::InvalidArgument("table '" + table + "' has row_offset " +
                                       std::to_string(row_offset) + " and num_rows " +
                                       std::to_string(num_rows) + "; both must be >= 0.");
  }
  int64_t end = 0;
  if (!CheckedAdd(row_offset, num_rows, &end)) {
    return ImplStatus::InvalidArgument(
        "table '" + table + "': row_offset " + std::to_string(row_offset) + " + num_rows " +
        std::to_string(num_rows) +
        " overflows int64, so its packed ids would wrap around; the packed table's rows "
        "must fit int64.");
  }
  return ImplStatus::Ok();
}

template <typename Id>
ImplStatus PackField(const Id* ids, int64_t n, int64_t row_offset, int64_t num_rows,
                     const std::string& table, int64_t* out) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    bad |= (id < 0) | (id >= num_rows);
    // Unsigned: an out-of-vocabulary id (its output is discarded: the call
    // fails) must not overflow; a valid one cannot (ValidateTable).
    out[i] = static_cast<int64_t>(static_cast<uint64_t>(id) + static_cast<uint64_t>(row_offset));
  }
  if (!bad) return ImplStatus::Ok();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= num_rows) {
      return ImplStatus::InvalidArgument(
          "embedding table '" + table + "' got id " + std::to_string(id) + " (flat position " +
          std::to_string(i) + " of its ids), outside its vocabulary [0, " +
          std::to_string(num_rows) +
          "). Ids must be in [0, input_dim): check the feature's hashing or vocabulary size.");
    }
  }
  return ImplStatus::Ok();
}

template <typename Id>
int64_t PackFieldCounting(const Id* ids, int64_t n, int64_t row_offset, int64_t num_rows,
                          int64_t* out) {
  int64_t invalid = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const bool bad = (id < 0) | (id >= num_rows);
    invalid += bad;
    out[i] = (bad ? 0 : id) + row_offset;
  }
  return invalid;
}

template ImplStatus PackField<int32_t>(const int32_t*, int64_t, int64_t, int64_t,
                                       const std::string&, int64_t*);
template ImplStatus PackField<int64_t>(const int64_t*, int64_t, int64_t, int64_t,
                                       const std::string&, int64_t*);
template int64_t PackFieldCounting<int32_t>(const int32_t*, int64_t, int64_t, int64_t, int64_t*);
template int64_t PackFieldCounting<int64_t>(const int64_t*, int64_t, int64_t, int64_t, int64_t*);

}  // namespace pack_ids
}  // namespace hybridtf
