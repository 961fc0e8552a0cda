// Op definitions and shape functions of HybridTF>Dice and its gradient: DIN's
// Dice activation with its train-mode batch normalization, fused.
#include <cstdint>

#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hybridtf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// x has rank >= 2; alpha (input `alpha_index`) is a vector of x's last dim. Sets *units.
Status DiceUnits(InferenceContext* c, int x_index, int alpha_index, DimensionHandle* units) {
  ShapeHandle x, alpha;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(x_index), 2, &x));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(alpha_index), 1, &alpha));
  return c->Merge(c->Dim(x, -1), c->Dim(alpha, 0), units);
}

}  // namespace

REGISTER_OP(HYBRIDTF_OP("Dice"))
    .Input("x: T")
    .Input("alpha: T")
    .Output("y: T")
    .Output("mean: T")
    .Output("variance: T")
    .Attr("T: {float, double}")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      DimensionHandle units;
      TF_RETURN_IF_ERROR(DiceUnits(c, 0, 1, &units));
      c->set_output(0, c->input(0));
      c->set_output(1, c->Vector(units));
      c->set_output(2, c->Vector(units));
      return Status();
    })
    .Doc(R"doc(
Dice activation (DIN) with train-mode batch normalization over every axis of x
but the last: mean and variance (biased) per unit over all rows,
z = x * inv + (-mean * inv) with inv = 1 / sqrt(variance + epsilon),
p = sigmoid(z), y = alpha * (1 - p) * x + p * x.

x: [..., units] (rank >= 2). alpha: [units].
y: x's shape. mean, variance: [units], the batch statistics (what a Keras
BatchNormalization feeds its moving averages).
)doc");

REGISTER_OP(HYBRIDTF_OP("DiceGrad"))
    .Input("dy: T")
    .Input("dmean: T")
    .Input("dvariance: T")
    .Input("x: T")
    .Input("alpha: T")
    .Input("mean: T")
    .Input("variance: T")
    .Output("dx: T")
    .Output("dalpha: T")
    .Attr("T: {float, double}")
    .Attr("epsilon: float")
    .SetShapeFn([](InferenceContext* c) -> Status {
      DimensionHandle units;
      TF_RETURN_IF_ERROR(DiceUnits(c, 3, 4, &units));
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->Merge(c->input(0), c->input(3), &x));
      for (int i : {1, 2, 5, 6}) {
        ShapeHandle v;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &v));
        TF_RETURN_IF_ERROR(c->Merge(c->Dim(v, 0), units, &units));
      }
      c->set_output(0, x);
      c->set_output(1, c->Vector(units));
      return Status();
    })
    .Doc(R"doc(
Gradient of Dice: dx (x's shape) and dalpha ([units]) for the gradients of y
(dy), of the mean and of the variance outputs, given Dice's inputs and its
mean and variance outputs. The batch-norm gradient runs through the batch
statistics (train mode).
)doc");

}  // namespace hybridtf
