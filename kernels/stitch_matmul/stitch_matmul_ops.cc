// Op definitions and shape functions of HybridTF>StitchConcatMatMul and its
// gradient: StitchConcat followed by a matrix product, computed through the
// distinct rows (the concatenated matrix is never written).
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
