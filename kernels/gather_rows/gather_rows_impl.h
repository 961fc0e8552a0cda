// TF-free implementation layer of GatherRows: out[i] = table[indices[i]].
//
// The packed lookup gathers the rows of its distinct ids from the packed
// table once per step: hundreds of thousands of short rows (1 to 64 values).
// TensorFlow's gather copies each row with a library memcpy of a run-time
// size; here a row of a common width is one fixed-size copy (a few vector
// moves), and the next rows are prefetched (the ids are ascending but spread
// over the whole table).
#ifndef HYBRIDTF_KERNELS_GATHER_ROWS_GATHER_ROWS_IMPL_H_
#define HYBRIDTF_KERNELS_GATHER_ROWS_GATHER_ROWS_IMPL_H_

#include <cstdint>

#include "kernels/common/parallel_for.h"
#include "kernels/common/status.h"

namespace hybridtf {
namespace gather_rows {

// out[i * dim ...] = table[indices[i] * dim ...] for i in [0, n). An index
// outside [0, num_rows) is an InvalidArgument naming the first such position
// (its output row is then zero; the caller discards the output).
template <typename T, typename Idx>
ImplStatus GatherRows(const T* table, int64_t num_rows, int64_t dim, const Idx* indices, int64_t n,
                      T* out, const ParallelFor& parallel_for);

}  // namespace gather_rows
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_GATHER_ROWS_GATHER_ROWS_IMPL_H_
