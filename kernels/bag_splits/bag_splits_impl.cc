// CPU implementation of BagSplits. See bag_splits_impl.h.
#include "kernels/bag_splits/bag_splits_impl.h"

namespace hybridtf {
namespace bag_splits {

namespace {

constexpr int64_t kMaxRows = int64_t{1} << 59;  // (nrows + 1) * 8 bytes fits int64

std::string Table(const std::string& table) { return "embedding table '" + table + "'"; }

}  // namespace

ImplStatus ValidateRows(int64_t nrows, const std::string& table) {
  if (nrows < 0 || nrows > kMaxRows) {
    return ImplStatus::InvalidArgument(
        Table(table) + ": the SparseTensor of ids has dense_shape[0] = " + std::to_string(nrows) +
        ", outside [0, 2^59]; dense_shape[0] is the number of examples of the batch.");
  }
  return ImplStatus::Ok();
}

ImplStatus SplitsFromRows(const int64_t* rows, int64_t n, int64_t nrows, const std::string& table,
                          int64_t* splits) {
  ImplStatus valid = ValidateRows(nrows, table);
  if (!valid.ok()) return valid;
  int64_t previous = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= nrows) {
      return ImplStatus::InvalidArgument(
          Table(table) + ": the SparseTensor of ids has row index " + std::to_string(r) +
          " (value " + std::to_string(i) +
          "), outside [0, dense_shape[0] = " + std::to_string(nrows) +
          "). Every index must lie within the dense_shape; fix how the SparseTensor is built.");
    }
    if (r < previous) {
      return ImplStatus::InvalidArgument(Table(table) + ": the SparseTensor of ids has row index " +
                                         std::to_string(r) + " after row " +
                                         std::to_string(previous) + " (value " + std::to_string(i) +
                                         "); order its indices first (tf.sparse.reorder).");
    }
    previous = r;
  }
  // splits[r + 1] counts the ids of rows <= r: a merge of the sorted rows with 0..nrows.
  int64_t i = 0;
  splits[0] = 0;
  for (int64_t r = 0; r < nrows; ++r) {
    while (i < n && rows[i] == r) ++i;
    splits[r + 1] = i;
  }
  return ImplStatus::Ok();
}

ImplStatus CheckSplits(const int64_t* splits, int64_t num_splits, int64_t n,
                       const std::string& table) {
  const std::string what = Table(table) + ": the RaggedTensor of ids has invalid row_splits: ";
  const std::string fix =
      " Row splits start at 0, never decrease and end at the number of values; build the "
      "RaggedTensor with validate=True (the default) to find where they go wrong.";
  if (num_splits < 1) return ImplStatus::InvalidArgument(what + "there are none." + fix);
  if (splits[0] != 0) {
    return ImplStatus::InvalidArgument(what + "row_splits[0] = " + std::to_string(splits[0]) +
                                       ", not 0." + fix);
  }
  for (int64_t k = 1; k < num_splits; ++k) {
    if (splits[k] < splits[k - 1]) {
      return ImplStatus::InvalidArgument(
          what + "row_splits[" + std::to_string(k - 1) + "] = " + std::to_string(splits[k - 1]) +
          " > row_splits[" + std::to_string(k) + "] = " + std::to_string(splits[k]) + "." + fix);
    }
  }
  if (splits[num_splits - 1] != n) {
    return ImplStatus::InvalidArgument(what + "the last one is " +
                                       std::to_string(splits[num_splits - 1]) + " but there are " +
                                       std::to_string(n) + " values." + fix);
  }
  return ImplStatus::Ok();
}

}  // namespace bag_splits
}  // namespace hybridtf
