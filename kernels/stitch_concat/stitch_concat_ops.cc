// Op definitions and shape functions of HybridTF>StitchConcat and its gradient:
// Stitch&Combine of the fields of several packed tables written straight into
// the columns of one concatenated matrix (the input of a model's Concatenate).
#include <cstdint>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/stitch_concat/stitch_concat_shape.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using stitch_concat_shape::CheckLayoutAttrs;
using stitch_concat_shape::CheckWidths;
using stitch_concat_shape::ConcatShape;
using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

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

}  // namespace hybridtf
