// Op definitions and shape functions of HybridTF>StitchConcat, StitchConcatMatMul
// and their gradients:
// Stitch&Combine of the fields of several packed tables written straight into
// the columns of one concatenated matrix (the input of a model's Concatenate).
#include <string>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/op_prefix.h"
#include "kernels/stitch_combine/stitch_combine_impl.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

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
Status ConcatWidth(InferenceContext* c, const std::vector<DimensionHandle>& group_dims,
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

}  // namespace

REGISTER_OP(HYBRIDTF_OP("StitchConcat"))
    .Input("rows: num_groups * T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("dense: num_dense * T")
    .Output("output: T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_groups: int >= 1")
    .Attr("num_dense: int >= 0")
    .Attr("group_fields: list(int)")
    .Attr("combiners: list(string)")
    .Attr("piece_groups: list(int)")
    .Attr("piece_items: list(int)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      DimensionHandle batch, width;
      TF_RETURN_IF_ERROR(ConcatShape(c, &batch, &width));
      c->set_output(0, c->Matrix(batch, width));
      return Status();
    })
    .Doc(R"doc(
Stitch&Combine of fields of several packed tables, written into one matrix.

Group g is one packed table's chain (as in StitchCombine: gathered rows of its
distinct ids, the inverse index and the field layout; combiners holds
group_fields[g] entries per group, in group order). The output concatenates
"pieces" along columns, in order: piece k is field piece_items[k] of group
piece_groups[k] ([rows, dim_g]), or, when piece_groups[k] is -1, the matrix
dense[piece_items[k]]. Every piece must have the same number of rows. Equal to
concatenating the StitchCombine outputs and the dense inputs, without the
per-field outputs.
)doc");

REGISTER_OP(HYBRIDTF_OP("StitchConcatGrad"))
    .Input("grad: T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("num_unique: num_groups * int64")
    .Output("d_rows: num_groups * T")
    .Output("d_dense: num_dense * T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_groups: int >= 1")
    .Attr("num_dense: int >= 0")
    .Attr("group_fields: list(int)")
    .Attr("combiners: list(string)")
    .Attr("piece_groups: list(int)")
    .Attr("piece_items: list(int)")
    .Attr("dims: list(int)")
    .Attr("dense_widths: list(int)")
    .Attr("broadcast_grad: bool = false")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_groups = 0, num_dense = 0;
      std::vector<int64_t> dims, dense_widths;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
      TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
      TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
      TF_RETURN_IF_ERROR(c->GetAttr("dense_widths", &dense_widths));
      TF_RETURN_IF_ERROR(CheckLayoutAttrs(c));
      TF_RETURN_IF_ERROR(CheckWidths(c, "dims", num_groups));
      TF_RETURN_IF_ERROR(CheckWidths(c, "dense_widths", num_dense));
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      for (int64_t g = 0; g < num_groups; ++g) {
        DimensionHandle rows;
        TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1 + 4 * num_groups + g, &rows));
        const int64_t dim = g < static_cast<int64_t>(dims.size()) ? dims[g] : -1;
        c->set_output(g, c->Matrix(rows, dim >= 0 ? c->MakeDim(dim) : c->UnknownDim()));
      }
      for (int64_t m = 0; m < num_dense; ++m) {
        const int64_t w = m < static_cast<int64_t>(dense_widths.size()) ? dense_widths[m] : -1;
        c->set_output(num_groups + m,
                      c->Matrix(c->Dim(grad, 0), w >= 0 ? c->MakeDim(w) : c->UnknownDim()));
      }
      return Status();
    })
    .Doc("Gradient of StitchConcat: d_rows[num_unique_g, dims[g]] per group, d_dense per dense.");

REGISTER_OP(HYBRIDTF_OP("StitchConcatMatMul"))
    .Input("rows: num_groups * T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("dense: num_dense * T")
    .Input("kernel: T")
    .Output("output: T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_groups: int >= 1")
    .Attr("num_dense: int >= 0")
    .Attr("group_fields: list(int)")
    .Attr("combiners: list(string)")
    .Attr("piece_groups: list(int)")
    .Attr("piece_items: list(int)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_groups = 0, num_dense = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
      TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
      DimensionHandle batch, width, unused;
      TF_RETURN_IF_ERROR(ConcatShape(c, &batch, &width));
      ShapeHandle kernel;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5 * num_groups + num_dense), 2, &kernel));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(kernel, 0), width, &unused));
      c->set_output(0, c->Matrix(batch, c->Dim(kernel, 1)));
      return Status();
    })
    .Doc(R"doc(
StitchConcat followed by a matrix product: output = StitchConcat(...) @ kernel.

Takes StitchConcat's inputs and attributes plus kernel ([width, units], width
being the concatenation's). Each field's block of the product is computed
through the distinct rows its positions read (each distinct row is multiplied
by the kernel block once), so the concatenated matrix is never written. Equal
to the unfused product up to float rounding.
)doc");

REGISTER_OP(HYBRIDTF_OP("StitchConcatMatMulGrad"))
    .Input("grad: T")
    .Input("kernel: T")
    .Input("rows: num_groups * T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("dense: num_dense * T")
    .Output("d_rows: num_groups * T")
    .Output("d_dense: num_dense * T")
    .Output("d_kernel: T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_groups: int >= 1")
    .Attr("num_dense: int >= 0")
    .Attr("group_fields: list(int)")
    .Attr("combiners: list(string)")
    .Attr("piece_groups: list(int)")
    .Attr("piece_items: list(int)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_groups = 0, num_dense = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
      TF_RETURN_IF_ERROR(c->GetAttr("num_dense", &num_dense));
      TF_RETURN_IF_ERROR(CheckLayoutAttrs(c));
      for (int64_t g = 0; g < num_groups; ++g) c->set_output(g, c->input(2 + g));
      for (int64_t m = 0; m < num_dense; ++m) {
        c->set_output(num_groups + m, c->input(2 + 5 * num_groups + m));
      }
      c->set_output(num_groups + num_dense, c->input(1));
      return Status();
    })
    .Doc("Gradient of StitchConcatMatMul: d_rows per group, d_dense per dense input, d_kernel.");

}  // namespace hybridtf
