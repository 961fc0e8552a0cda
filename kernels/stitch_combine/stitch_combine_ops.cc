// Op definitions and shape functions of HybridTF>StitchCombine and its gradient.
#include <string>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Inputs after the first (rows / grads): inverse, field_sizes, field_segments,
// segment_lengths, weights — all vectors.
Status CheckLayoutInputs(InferenceContext* c, int first) {
  ShapeHandle unused;
  for (int i = first; i < first + 5; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  }
  return Status();
}

// combiners: num_fields entries, each a known combiner name.
Status CheckCombiners(InferenceContext* c) {
  int64_t num_fields = 0;
  std::vector<std::string> combiners;
  TF_RETURN_IF_ERROR(c->GetAttr("num_fields", &num_fields));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  if (static_cast<int64_t>(combiners.size()) != num_fields) {
    return ::tensorflow::errors::InvalidArgument("combiners has ", combiners.size(),
                                                 " entries but num_fields is ", num_fields,
                                                 "; give one per field.");
  }
  for (const std::string& name : combiners) {
    if (name != "none" && name != "sum" && name != "mean" && name != "sqrtn") {
      return ::tensorflow::errors::InvalidArgument(
          "combiner must be one of 'none', 'sum', 'mean', 'sqrtn', got '", name, "'.");
    }
  }
  return Status();
}

}  // namespace

REGISTER_OP(HYBRIDTF_OP("StitchCombine"))
    .Input("rows: T")
    .Input("inverse: Tidx")
    .Input("field_sizes: int64")
    .Input("field_segments: int64")
    .Input("segment_lengths: int64")
    .Input("weights: T")
    .Output("outputs: num_fields * T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_fields: int >= 1")
    .Attr("combiners: list(string)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(CheckCombiners(c));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(CheckLayoutInputs(c, 1));
      const DimensionHandle dim = c->Dim(rows, 1);
      for (int i = 0; i < c->num_outputs(); ++i) {
        c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, dim));
      }
      return Status();
    })
    .Doc(R"doc(
Fused stitch + combine: per-field outputs from the gathered rows of distinct ids.

Field f owns field_sizes[f] consecutive positions of `inverse`. With combiner
"none" every position is an output row rows[inverse[i]]; with "sum", "mean" or
"sqrtn" the positions form field_segments[f] bags whose lengths are the next
entries of segment_lengths, each combined (optionally weighted by `weights`;
empty `weights` means 1). Empty bags give zero rows.
)doc");

REGISTER_OP(HYBRIDTF_OP("StitchCombineGrad"))
    .Input("grads: num_fields * T")
    .Input("inverse: Tidx")
    .Input("field_sizes: int64")
    .Input("field_segments: int64")
    .Input("segment_lengths: int64")
    .Input("weights: T")
    .Input("num_unique: int64")
    .Output("d_rows: T")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .Attr("num_fields: int >= 1")
    .Attr("combiners: list(string)")
    .SetShapeFn([](InferenceContext* c) -> Status {
      int64_t num_fields = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_fields", &num_fields));
      TF_RETURN_IF_ERROR(CheckCombiners(c));
      DimensionHandle dim = c->UnknownDim();
      for (int i = 0; i < num_fields; ++i) {
        ShapeHandle g;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &g));
        TF_RETURN_IF_ERROR(c->Merge(dim, c->Dim(g, 1), &dim));
      }
      TF_RETURN_IF_ERROR(CheckLayoutInputs(c, num_fields));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_fields + 5), 0, &unused));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(num_fields + 5, &rows));
      c->set_output(0, c->Matrix(rows, dim));
      return Status();
    })
    .Doc("Gradient of StitchCombine with respect to `rows`: d_rows[num_unique, D].");

}  // namespace hybridtf
