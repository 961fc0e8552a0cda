// TF-free implementation layer of PackIds: the K-packing of ids.
//
// The ids of every field of a packed table go into one int64 id vector in the
// packed table's row space: field f's ids are validated against its table's
// vocabulary [0, num_rows_f) and shifted by the table's row offset. The error
// for an id outside the vocabulary names the table, so the packed path and an
// un-rewritten lookup report the same problem the same way.
#ifndef HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_IMPL_H_
#define HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_IMPL_H_

#include <cstdint>
#include <string>

#include "kernels/common/status.h"

namespace hybridtf {
namespace pack_ids {

// Checks a table's attributes: row_offset >= 0, num_rows >= 0 and
// row_offset + num_rows fits int64 (so that every packed id of the table,
// at most row_offset + num_rows - 1, does). Names the table and the fix.
ImplStatus ValidateTable(int64_t row_offset, int64_t num_rows, const std::string& table);

// Writes out[i] = ids[i] + row_offset for i in [0, n), after checking that
// every id is in [0, num_rows). `table` names the table in the error.
template <typename Id>
ImplStatus PackField(const Id* ids, int64_t n, int64_t row_offset, int64_t num_rows,
                     const std::string& table, int64_t* out);

// Like PackField, but an id outside [0, num_rows) becomes row_offset (the
// table's first row) instead of an error. Returns the number of such ids.
template <typename Id>
int64_t PackFieldCounting(const Id* ids, int64_t n, int64_t row_offset, int64_t num_rows,
                          int64_t* out);

}  // namespace pack_ids
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_IMPL_H_
