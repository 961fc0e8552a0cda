// Op definitions of the regularized fused updates (resource variables).
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::InferenceContext;

namespace {
Status NoOutputs(InferenceContext*) { return Status(); }
}  // namespace

REGISTER_OP(HYBRIDTF_OP("RegularizedApplySgd"))
    .Input("var: resource")
    .Input("lr: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Input("reg_ranges: int64")
    .Input("reg_l1: float")
    .Input("reg_l2: float")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(NoOutputs)
    .Doc(R"doc(
Keras SGD (no momentum) on a packed table whose rows reg_ranges[k] = [begin, end)
carry an L1/L2 regularizer (factors reg_l1[k], reg_l2[k]): those rows take the
dense update with gradient batch + l1 * sign(w) + 2 * l2 * w; other rows the
sparse update of their batch gradient (indices distinct).
)doc");

REGISTER_OP(HYBRIDTF_OP("RegularizedApplyAdagrad"))
    .Input("var: resource")
    .Input("accum: resource")
    .Input("lr: float")
    .Input("epsilon: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Input("reg_ranges: int64")
    .Input("reg_l1: float")
    .Input("reg_l2: float")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(NoOutputs)
    .Doc("Keras Adagrad on a packed table with regularized row ranges (see RegularizedApplySgd).");

REGISTER_OP(HYBRIDTF_OP("RegularizedApplyAdam"))
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("alpha: float")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .Input("epsilon: float")
    .Input("grad: float")
    .Input("indices: Tidx")
    .Input("reg_ranges: int64")
    .Input("reg_l1: float")
    .Input("reg_l2: float")
    .Attr("Tidx: {int32, int64}")
    .Attr("lazy: bool = false")
    .SetShapeFn(NoOutputs)
    .Doc(R"doc(
Keras Adam (lazy=false) or hybridtf LazyAdam (lazy=true) on a packed table with
regularized row ranges: those rows take Keras Adam's dense update (LazyAdam
gets a dense gradient there, so it runs Adam too); other rows the sparse update.
)doc");

}  // namespace hybridtf
