// TF-free implementation layer of BagSplits: the row splits of multi-hot bags, validated.
//
// A multi-hot lookup's ids arrive as a tf.SparseTensor (a row index per id) or
// a tf.RaggedTensor (row splits). TensorFlow validates neither when they are
// built with validate=False or converted without checks, and a bad row index
// or split would drop an id or move it to another example without a word (a
// segment sum skips negative segments). BagSplits turns row indices into row
// splits, or checks given splits, and fails with an error naming the table,
// the offending position and the fix.
#ifndef HYBRIDTF_KERNELS_BAG_SPLITS_BAG_SPLITS_IMPL_H_
#define HYBRIDTF_KERNELS_BAG_SPLITS_BAG_SPLITS_IMPL_H_

#include <cstdint>
#include <string>

#include "kernels/common/status.h"

namespace hybridtf {
namespace bag_splits {

// Checks nrows (the SparseTensor's dense_shape[0]): in [0, 2^59], so the
// nrows + 1 splits and their bytes fit int64.
ImplStatus ValidateRows(int64_t nrows, const std::string& table);

// splits[0, nrows] from the row index of each of n ids (a SparseTensor's
// indices[:, 0] in row-major order): every row in [0, nrows) and the rows
// non-decreasing. splits[r] is the number of ids of rows < r.
ImplStatus SplitsFromRows(const int64_t* rows, int64_t n, int64_t nrows, const std::string& table,
                          int64_t* splits);

// Checks RaggedTensor row splits of n values: num_splits >= 1,
// splits[0] == 0, non-decreasing, splits[num_splits - 1] == n.
ImplStatus CheckSplits(const int64_t* splits, int64_t num_splits, int64_t n,
                       const std::string& table);

}  // namespace bag_splits
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_BAG_SPLITS_BAG_SPLITS_IMPL_H_
