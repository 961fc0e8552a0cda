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

REGISTER_OP(HYBRIDTF_OP("RegularizationPenalty"))
    .Input("var: resource")
    .Input("reg_ranges: int64")
    .Input("reg_l1: float")
    .Input("reg_l2: float")
    .Output("penalties: float")
    .SetShapeFn([](InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle ranges, l1, l2;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &ranges));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &l1));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &l2));
      ::tensorflow::shape_inference::DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(ranges, 0), c->Dim(l1, 0), &n));
      TF_RETURN_IF_ERROR(c->Merge(n, c->Dim(l2, 0), &n));
      c->set_output(0, c->Vector(n));
      return Status();
    })
    .Doc(R"doc(
The values of the L1/L2 penalties of a packed float32 table's regularized row
ranges reg_ranges[k] = [begin, end) (factors reg_l1[k], reg_l2[k]) in one read
of the rows, penalties[k] = l1 * sum|w| + 2 * l2 * (sum(w^2) / 2) over the
range's rows, what Keras's L1 / L2 / L1L2 regularizers return for the member
table. Reads the variable under its shared lock; no gradient (the fused
updates add it).
)doc");

}  // namespace hybridtf
