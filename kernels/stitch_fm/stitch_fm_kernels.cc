// CPU kernels of HybridTF>StitchFM and StitchFMGrad: the stitch_fm
// implementation layer behind StitchConcat's layout attributes.
#include <utility>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_concat/stitch_concat_kernels.h"
#include "kernels/stitch_fm/stitch_fm_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

template <typename T, typename Idx>
class StitchFMOpBase : public StitchConcatOpBase {
 public:
  explicit StitchFMOpBase(OpKernelConstruction* ctx) : StitchConcatOpBase(ctx) {
    OP_REQUIRES(ctx, num_dense_ == 0,
                errors::InvalidArgument("StitchFM takes embedding fields only, got num_dense ",
                                        num_dense_, "; leave dense inputs out of the FM."));
  }

 protected:
  Status Read(OpKernelContext* ctx, int first_rows, ConcatInputs<T, Idx>* in, int64_t* dim) const {
    TF_RETURN_IF_ERROR(this->ReadInputs(ctx, first_rows, /*validate_inverse=*/true, in));
    *dim = ctx->input(first_rows).dim_size(1);
    return ToTfStatus(CheckFMLayout(in->groups, in->pieces, in->batch, *dim));
  }
};

template <typename T, typename Idx>
class StitchFMCpuOp : public StitchFMOpBase<T, Idx> {
 public:
  explicit StitchFMCpuOp(OpKernelConstruction* ctx) : StitchFMOpBase<T, Idx>(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ConcatInputs<T, Idx> in;
    int64_t dim = 0;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 0, &in, &dim));
    Tensor* output = nullptr;
    Tensor* sums = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.batch, dim}), &output));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({in.batch, dim}), &sums));
    OP_REQUIRES_OK(ctx, ToTfStatus(ForwardFM<T, Idx>(in.groups, in.pieces, in.batch, dim,
                                                     output->flat<T>().data(),
                                                     sums->flat<T>().data(), CpuParallelFor(ctx))));
  }
};

template <typename T, typename Idx>
class StitchFMGradCpuOp : public StitchFMOpBase<T, Idx> {
 public:
  explicit StitchFMGradCpuOp(OpKernelConstruction* ctx) : StitchFMOpBase<T, Idx>(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int ng = static_cast<int>(this->num_groups_);
    const Tensor& grad = ctx->input(0);
    const Tensor& sums = ctx->input(1);
    const Tensor& grad_sums = ctx->input(2);
    ConcatInputs<T, Idx> in;
    int64_t dim = 0;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 3, &in, &dim));
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"grad", &grad},
                                  std::pair<const char*, const Tensor*>{"sums", &sums},
                                  std::pair<const char*, const Tensor*>{"grad_sums", &grad_sums}}) {
      OP_REQUIRES(
          ctx, t->dims() == 2 && t->dim_size(0) == in.batch && t->dim_size(1) == dim,
          errors::InvalidArgument("StitchFMGrad: ", name, " must have shape [", in.batch, ", ", dim,
                                  "] (StitchFM's outputs), got ", t->shape().DebugString(), "."));
    }
    std::vector<T*> d_rows(ng);
    for (int g = 0; g < ng; ++g) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(g, ctx->input(3 + g).shape(), &out));
      d_rows[g] = out->flat<T>().data();
    }
    OP_REQUIRES_OK(
        ctx, ToTfStatus(BackwardFM<T, Idx>(
                 in.groups, in.pieces, in.batch, dim, grad.flat<T>().data(), sums.flat<T>().data(),
                 grad_sums.flat<T>().data(), d_rows, CpuParallelFor(ctx))));
  }
};

#define HYBRIDTF_REGISTER_CPU(T, Idx)                           \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchFM"))         \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Idx>("Tidx"),     \
                          StitchFMCpuOp<T, Idx>);               \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchFMGrad"))     \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Idx>("Tidx"),     \
                          StitchFMGradCpuOp<T, Idx>);

HYBRIDTF_REGISTER_CPU(float, int32_t)
HYBRIDTF_REGISTER_CPU(float, int64_t)
HYBRIDTF_REGISTER_CPU(double, int32_t)
HYBRIDTF_REGISTER_CPU(double, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace stitch_combine
}  // namespace hybridtf
