// Op definition of GatherRows: rows of a resource variable (a packed table).
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// [num_indices, the table's width when the handle knows it].
Status GatherRowsShape(InferenceContext* c) {
  ShapeHandle indices;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
  DimensionHandle width = c->UnknownDim();
  const auto* handle_data = c->input_handle_shapes_and_types(0);
  if (handle_data != nullptr && handle_data->size() == 1) {
    ShapeHandle table = (*handle_data)[0].shape;
    if (c->RankKnown(table)) {
      TF_RETURN_IF_ERROR(c->WithRank(table, 2, &table));
      width = c->Dim(table, 1);
    }
  }
  c->set_output(0, c->Matrix(c->Dim(indices, 0), width));
  return Status();
}

}  // namespace

REGISTER_OP(HYBRIDTF_OP("GatherRows"))
    .Input("table: resource")
    .Input("indices: Tidx")
    .Output("rows: dtype")
    .Attr("dtype: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(GatherRowsShape)
    .Doc(R"doc(
rows[i] = table[indices[i]] for a [num_rows, dim] resource variable (the
packed lookup's gather of its distinct ids; TensorFlow's ResourceGather with
fixed-size row copies). An index outside [0, num_rows) is an InvalidArgument.
)doc");

}  // namespace hybridtf
