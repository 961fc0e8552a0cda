// Op definitions of the fused sparse optimizer updates (resource variables).
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;

namespace {
Status NoOutputs(InferenceContext*) { return Status(); }
}  // namespace

REGISTER_OP(HYBRIDTF_OP("SparseApplySgd"))
    .Input("var: resource")
    .Input("lr: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(NoOutputs)
    .Doc("var[indices] += -grad * lr (Keras SGD, no momentum); indices distinct.");

REGISTER_OP(HYBRIDTF_OP("SparseApplyAdagrad"))
    .Input("var: resource")
    .Input("accum: resource")
    .Input("lr: float")
    .Input("epsilon: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(NoOutputs)
    .Doc("Keras Adagrad update of the rows `indices` (distinct) of var and accum.");

REGISTER_OP(HYBRIDTF_OP("SparseApplyAdam"))
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("alpha: float")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .Input("epsilon: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Attr("Tidx: {int32, int64}")
    .Attr("lazy: bool = false")
    .SetShapeFn(NoOutputs)
    .Doc(R"doc(
Keras Adam update for a sparse gradient with distinct rows: the moments of all
rows decay and every row moves (lazy=false, exact Keras semantics), or only
the touched rows are updated (lazy=true, LazyAdam).
)doc");

}  // namespace hybridtf
