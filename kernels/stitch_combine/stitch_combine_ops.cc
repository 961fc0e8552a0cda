// Op definitions and shape functions of HybridTF>StitchCombine and its gradient.
#include <string>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

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

// id_shapes: empty, or one entry per field; a known shape only for a one-hot
// field, of rank >= 1 with at most one unknown dimension.
Status CheckIdShapes(InferenceContext* c, std::vector<::tensorflow::PartialTensorShape>* shapes) {
  int64_t num_fields = 0;
  std::vector<std::string> combiners;
  TF_RETURN_IF_ERROR(c->GetAttr("num_fields", &num_fields));
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("id_shapes", shapes));
  if (shapes->empty()) return Status();
  if (static_cast<int64_t>(shapes->size()) != num_fields) {
    return ::tensorflow::errors::InvalidArgument(
        "id_shapes has ", shapes->size(), " entries but num_fields is ", num_fields,
        "; give one per field (an unknown rank keeps a field's output [rows, dim]) or none.");
  }
  for (int64_t f = 0; f < num_fields; ++f) {
    const ::tensorflow::PartialTensorShape& s = (*shapes)[f];
    if (s.unknown_rank()) continue;
    int unknown = 0;
    for (int d = 0; d < s.dims(); ++d) unknown += s.dim_size(d) < 0 ? 1 : 0;
    if (combiners[f] != "none" || s.dims() < 1 || unknown > 1) {
      return ::tensorflow::errors::InvalidArgument(
          "id_shapes[", f, "] = ", s.DebugString(),
          " must be the shape of a one-hot field's ids (rank >= 1, at most one unknown "
          "dimension) or of unknown rank; field ",
          f, " has combiner '", combiners[f], "'.");
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
    .Attr("id_shapes: list(shape) = []")
    .SetShapeFn([](InferenceContext* c) -> Status {
      TF_RETURN_IF_ERROR(CheckCombiners(c));
      std::vector<::tensorflow::PartialTensorShape> id_shapes;
      TF_RETURN_IF_ERROR(CheckIdShapes(c, &id_shapes));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(CheckLayoutInputs(c, 1));
      const DimensionHandle dim = c->Dim(rows, 1);
      for (int i = 0; i < c->num_outputs(); ++i) {
        if (id_shapes.empty() || id_shapes[i].unknown_rank()) {
          c->set_output(i, c->Matrix(InferenceContext::kUnknownDim, dim));
          continue;
        }
        ShapeHandle ids;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(id_shapes[i], &ids));
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->Concatenate(ids, c->Vector(dim), &out));
        c->set_output(i, out);
      }
      return Status();
    })
    .Doc(R"doc(
Fused stitch + combine: per-field outputs from the gathered rows of distinct ids.

Field f owns field_sizes[f] consecutive positions of `inverse`. With combiner
"none" every position is an output row rows[inverse[i]]; with "sum", "mean" or
"sqrtn" the positions form field_segments[f] bags whose lengths are the next
entries of segment_lengths, each combined (optionally weighted by `weights`;
empty `weights` means 1). Empty bags give zero rows. With `id_shapes`, a one-hot
field whose entry has a known rank has the shape of its ids plus [dim] (its
unknown dimension, if any, resolved from field_sizes), not [rows, dim].
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
        TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 2, &g));
        TF_RETURN_IF_ERROR(c->Merge(dim, c->Dim(g, -1), &dim));
      }
      TF_RETURN_IF_ERROR(CheckLayoutInputs(c, num_fields));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(num_fields + 5), 0, &unused));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(num_fields + 5, &rows));
      c->set_output(0, c->Matrix(rows, dim));
      return Status();
    })
    .Doc(R"doc(
Gradient of StitchCombine with respect to `rows`: d_rows[num_unique, D]. Each
grads[f] has the shape of StitchCombine's outputs[f]: [rows_f, D], or a one-hot
field's ids' shape plus [D].
)doc");

}  // namespace hybridtf
