// CPU kernels of HybridTF>Dice and DiceGrad: the dice implementation layer
// behind TensorFlow tensors (x's leading axes flattened into rows).
#include <cmath>
#include <cstdint>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/dice/dice_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace dice {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::errors::InvalidArgument;

namespace {

// The epsilon attribute, checked once (finite, >= 0).
void ReadEpsilon(OpKernelConstruction* ctx, float* epsilon) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", epsilon));
  OP_REQUIRES(ctx, std::isfinite(*epsilon) && *epsilon >= 0,
              InvalidArgument("Dice: epsilon must be finite and >= 0, got ", *epsilon, "."));
}

// rows and units of x ([..., units], rank >= 2) with alpha a [units] vector.
Status XShape(const char* op, const Tensor& x, const Tensor& alpha, double epsilon, int64_t* rows,
              int64_t* units) {
  if (x.dims() < 2) {
    return InvalidArgument(op, ": x must have rank >= 2 ([..., units]), got shape ",
                           x.shape().DebugString(), ".");
  }
  if (!TensorShapeUtils::IsVector(alpha.shape())) {
    return InvalidArgument(op, ": alpha must be a vector [units], got shape ",
                           alpha.shape().DebugString(), ".");
  }
  *units = x.dim_size(x.dims() - 1);
  *rows = *units == 0 ? 0 : x.NumElements() / *units;
  return ToTfStatus(CheckDiceShapes(*rows, *units, alpha.NumElements(), epsilon));
}

Status UnitVector(const char* op, const char* name, const Tensor& t, int64_t units) {
  if (!TensorShapeUtils::IsVector(t.shape()) || t.NumElements() != units) {
    return InvalidArgument(op, ": ", name, " must have shape [", units,
                           "] (one value per unit of x), got ", t.shape().DebugString(), ".");
  }
  return Status();
}

}  // namespace

template <typename T>
class DiceCpuOp : public OpKernel {
 public:
  explicit DiceCpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) { ReadEpsilon(ctx, &epsilon_); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& alpha = ctx->input(1);
    int64_t rows = 0, units = 0;
    OP_REQUIRES_OK(ctx, XShape("Dice", x, alpha, epsilon_, &rows, &units));
    Tensor *y = nullptr, *mean = nullptr, *variance = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {units}, &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {units}, &variance));
    OP_REQUIRES_OK(ctx, ToTfStatus(DiceForward<T>(
                            x.flat<T>().data(), alpha.flat<T>().data(), rows, units,
                            static_cast<T>(epsilon_), y->flat<T>().data(), mean->flat<T>().data(),
                            variance->flat<T>().data(), CpuParallelFor(ctx))));
  }

 private:
  float epsilon_ = 0;
};

template <typename T>
class DiceGradCpuOp : public OpKernel {
 public:
  explicit DiceGradCpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) { ReadEpsilon(ctx, &epsilon_); }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(3);
    const Tensor& alpha = ctx->input(4);
    int64_t rows = 0, units = 0;
    OP_REQUIRES_OK(ctx, XShape("DiceGrad", x, alpha, epsilon_, &rows, &units));
    OP_REQUIRES(ctx, dy.shape() == x.shape(),
                InvalidArgument("DiceGrad: dy must have x's shape ", x.shape().DebugString(),
                                ", got ", dy.shape().DebugString(), "."));
    OP_REQUIRES_OK(ctx, UnitVector("DiceGrad", "dmean", ctx->input(1), units));
    OP_REQUIRES_OK(ctx, UnitVector("DiceGrad", "dvariance", ctx->input(2), units));
    OP_REQUIRES_OK(ctx, UnitVector("DiceGrad", "mean", ctx->input(5), units));
    OP_REQUIRES_OK(ctx, UnitVector("DiceGrad", "variance", ctx->input(6), units));
    Tensor *dx = nullptr, *dalpha = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {units}, &dalpha));
    OP_REQUIRES_OK(ctx, ToTfStatus(DiceBackward<T>(
                            dy.flat<T>().data(), ctx->input(1).flat<T>().data(),
                            ctx->input(2).flat<T>().data(), x.flat<T>().data(),
                            alpha.flat<T>().data(), ctx->input(5).flat<T>().data(),
                            ctx->input(6).flat<T>().data(), rows, units, static_cast<T>(epsilon_),
                            dx->flat<T>().data(), dalpha->flat<T>().data(), CpuParallelFor(ctx))));
  }

 private:
  float epsilon_ = 0;
};

#define HYBRIDTF_REGISTER_CPU(T)                                                             \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name(HYBRIDTF_OP("Dice")).Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
      DiceCpuOp<T>);                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name(HYBRIDTF_OP("DiceGrad")).Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DiceGradCpuOp<T>);

HYBRIDTF_REGISTER_CPU(float)
HYBRIDTF_REGISTER_CPU(double)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace dice
}  // namespace hybridtf
