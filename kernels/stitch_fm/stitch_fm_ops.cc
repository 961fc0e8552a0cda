// Op definitions and shape functions of HybridTF>StitchFM and its gradient:
// a factorization machine's pairwise interaction over fields of packed tables,
// from their distinct rows (the stacked fields are never written).
#include <cstdint>

#include "kernels/common/op_prefix.h"
#include "kernels/stitch_concat/stitch_concat_shape.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using stitch_concat_shape::CheckLayoutAttrs;
using stitch_concat_shape::ConcatShape;
using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP(HYBRIDTF_OP("StitchFM"))
    .Input("rows: num_groups * T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("dense: num_dense * T")
    .Output("output: T")
    .Output("sums: T")
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
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      c->set_output(0, c->Matrix(batch, c->Dim(rows, 1)));
      c->set_output(1, c->output(0));
      return Status();
    })
    .Doc(R"doc(
Pairwise interaction of a factorization machine over the pieces of a
StitchConcat layout: output[b] = (sum_f e_f)^2 - sum_f e_f^2, elementwise over
the embedding dim, e_f being field f's (combined) embedding of row b.

Takes StitchConcat's inputs and attributes; every piece must be a field
(num_dense 0) and every group must have the same dim. Output [batch, dim];
sums [batch, dim] is sum_f e_f, which StitchFMGrad takes back.
Equal to stacking the fields ([batch, fields, dim]) and computing
square(reduce_sum(x, 1)) - reduce_sum(x * x, 1), up to float rounding.
)doc");

REGISTER_OP(HYBRIDTF_OP("StitchFMGrad"))
    .Input("grad: T")
    .Input("sums: T")
    .Input("grad_sums: T")
    .Input("rows: num_groups * T")
    .Input("inverses: num_groups * Tidx")
    .Input("field_sizes: num_groups * int64")
    .Input("field_segments: num_groups * int64")
    .Input("segment_lengths: num_groups * int64")
    .Input("dense: num_dense * T")
    .Output("d_rows: num_groups * T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_groups: int >= 1")
    .Attr("num_dense: int >= 0")
    .Attr("group_fields: list(int)")
    .Attr("combiners: list(string)")
    .Attr("piece_groups: list(int)")
    .Attr("piece_items: list(int)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_groups = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_groups", &num_groups));
      TF_RETURN_IF_ERROR(CheckLayoutAttrs(c));
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->Merge(grad, c->input(1), &grad));
      TF_RETURN_IF_ERROR(c->Merge(grad, c->input(2), &grad));
      for (int64_t g = 0; g < num_groups; ++g) c->set_output(g, c->input(3 + g));
      return Status();
    })
    .Doc(R"doc(
Gradient of StitchFM: d_rows per group (the rows' shapes), for grad = d output,
sums = StitchFM's second output on the same inputs and grad_sums = d sums
(zeros when only the cross term is used).
)doc");

}  // namespace hybridtf
