// Shape-function helpers of the StitchConcat-family ops (stitch_concat_shape.h).
#include "kernels/stitch_concat/stitch_concat_shape.h"

#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {
namespace stitch_concat_shape {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// The layout attributes every StitchConcat-family op takes, checked as the
// kernels check them: group_fields (num_groups entries, each >= 1) summing to
// the number of combiners, known combiner names, equal-length non-empty
// piece lists naming existing fields / dense inputs once each.
Status CheckLayoutAttrs(InferenceContext* c) {
  int64_t num_groups = 0, num_dense = 0;
  std::vector<int64_t> group_fields, piece_groups, piece_items;
  std::vector<std::string> combiners;
  TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
  TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
  TF_RETURN_IF_ERROR(c->GetAttr("group_fields", &group_fields));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("piece_groups", &piece_groups));
  TF_RETURN_IF_ERROR(c->GetAttr("piece_items", &piece_items));
  namespace errors = ::tensorflow::errors;
  if (static_cast<int64_t>(group_fields.size()) != num_groups) {
    return errors::InvalidArgument("group_fields has ", group_fields.size(),
                                   " entries but num_groups is ", num_groups, ".");
  }
  int64_t total = 0;
  for (const int64_t f : group_fields) {
    if (f < 1 || !CheckedAdd(total, f, &total)) {
      return errors::InvalidArgument(
          "every group needs >= 1 field and the group_fields must "
          "sum to the number of combiners, got ",
          f, ".");
    }
  }
  if (static_cast<int64_t>(combiners.size()) != total) {
    return errors::InvalidArgument("combiners has ", combiners.size(),
                                   " entries but the groups have ", total,
                                   " fields; give one per field.");
  }
  for (const std::string& name : combiners) {
    stitch_combine::Combiner unused;
    if (!stitch_combine::ParseCombiner(name, &unused)) {
      return errors::InvalidArgument(
          "combiner must be one of 'none', 'sum', 'mean', 'sqrtn', got '", name, "'.");
    }
  }
  if (piece_groups.size() != piece_items.size() || piece_groups.empty()) {
    return errors::InvalidArgument(
        "piece_groups and piece_items must be non-empty and of equal length, got ",
        piece_groups.size(), " and ", piece_items.size(), ".");
  }
  for (size_t k = 0; k < piece_groups.size(); ++k) {
    const int64_t g = piece_groups[k], item = piece_items[k];
    if (g == -1 && (item < 0 || item >= num_dense)) {
      return errors::InvalidArgument("piece ", k, " names dense input ", item, " of ", num_dense,
                                     ", which does not exist; every dense input must be used "
                                     "exactly once.");
    }
    if (g != -1 && (g < 0 || g >= num_groups || item < 0 || item >= group_fields[g])) {
      return errors::InvalidArgument("piece ", k, " names field ", item, " of group ", g,
                                     ", which does not exist; a field can be placed once.");
    }
  }
  return Status();
}

// A list(int) attribute of widths: every entry in [0, kMaxWidth].
Status CheckWidths(InferenceContext* c, const char* name, int64_t count) {
  std::vector<int64_t> widths;
  TF_RETURN_IF_ERROR(c->GetAttr(name, &widths));
  if (static_cast<int64_t>(widths.size()) != count) {
    return ::tensorflow::errors::InvalidArgument(name, " has ", widths.size(), " entries, needs ",
                                                 count, ".");
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 0 || widths[i] > stitch_combine::kMaxWidth) {
      return ::tensorflow::errors::InvalidArgument(name, "[", i, "] = ", widths[i],
                                                   " must be in [0, ", stitch_combine::kMaxWidth,
                                                   "] (a column count).");
    }
  }
  return Status();
}

// Width of the concatenation from the piece attrs and the given per-group and
// per-dense widths (unknown if any is unknown).
static Status ConcatWidth(InferenceContext* c, const std::vector<DimensionHandle>& group_dims,
                          const std::vector<DimensionHandle>& dense_dims, DimensionHandle* width) {
  std::vector<int64_t> piece_groups, piece_items;
  TF_RETURN_IF_ERROR(c->GetAttr("piece_groups", &piece_groups));
  TF_RETURN_IF_ERROR(c->GetAttr("piece_items", &piece_items));
  *width = c->MakeDim(0);
  for (size_t k = 0; k < piece_groups.size() && k < piece_items.size(); ++k) {
    const int64_t g = piece_groups[k], item = piece_items[k];
    DimensionHandle w = c->UnknownDim();
    if (g >= 0 && g < static_cast<int64_t>(group_dims.size())) w = group_dims[g];
    if (g < 0 && item >= 0 && item < static_cast<int64_t>(dense_dims.size())) w = dense_dims[item];
    TF_RETURN_IF_ERROR(c->Add(*width, w, width));
  }
  return Status();
}

// Batch and width of StitchConcat's output from its inputs (rows, index lists
// and dense matrices as StitchConcat and StitchConcatMatMul take them).
Status ConcatShape(InferenceContext* c, DimensionHandle* batch, DimensionHandle* width) {
  TF_RETURN_IF_ERROR(CheckLayoutAttrs(c));
  int64_t num_groups = 0, num_dense = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
  TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
  std::vector<DimensionHandle> group_dims, dense_dims;
  for (int64_t g = 0; g < num_groups; ++g) {
    ShapeHandle rows;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(g), 2, &rows));
    group_dims.push_back(c->Dim(rows, 1));
  }
  ShapeHandle unused;
  for (int64_t i = num_groups; i < 5 * num_groups; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  }
  *batch = c->UnknownDim();
  for (int64_t m = 0; m < num_dense; ++m) {
    ShapeHandle d;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(5 * num_groups + m), 2, &d));
    TF_RETURN_IF_ERROR(c->Merge(*batch, c->Dim(d, 0), batch));
    dense_dims.push_back(c->Dim(d, 1));
  }
  return ConcatWidth(c, group_dims, dense_dims, width);
}

}  // namespace stitch_concat_shape
}  // namespace hybridtf
