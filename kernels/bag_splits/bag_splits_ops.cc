// Op definition of HybridTF>BagSplits.
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP(HYBRIDTF_OP("BagSplits"))
    .Input("values: Tvalues")
    .Input("rows: int64")
    .Input("nrows: int64")
    .Output("checked_values: Tvalues")
    .Output("row_splits: int64")
    .Attr("Tvalues: {int32, int64}")
    .Attr("kind: {'row_ids', 'row_splits'}")
    .Attr("table: string")
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle values, rows, nrows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &nrows));
      c->set_output(0, values);
      std::string kind;
      TF_RETURN_IF_ERROR(c->GetAttr("kind", &kind));
      if (kind == "row_splits") {
        c->set_output(1, rows);
      } else {
        c->set_output(1, c->Vector(c->UnknownDim()));
      }
      return Status();
    })
    .Doc(R"doc(
The row splits of one multi-hot lookup's bags, validated; the values pass
through (so the lookup runs after the check). kind = "row_ids": rows are the
values' row indices (a SparseTensor's indices[:, 0], row-major order), each in
[0, nrows); row_splits has nrows + 1 entries. kind = "row_splits": rows are a
RaggedTensor's row splits (nrows is ignored), checked to start at 0, never
decrease and end at the number of values, and returned. A bad index or split
fails with InvalidArgument naming the table.
)doc");

}  // namespace hybridtf
