// CPU kernels of HybridTF>StitchConcatMatMul and StitchConcatMatMulGrad: the
// stitch_matmul implementation layer behind StitchConcat's layout attributes.
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"
#include "kernels/stitch_concat/stitch_concat_kernels.h"
#include "kernels/stitch_matmul/stitch_matmul_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

// StitchConcat's inputs (starting at input `first_rows`; inverse indices are
// checked by the implementation layer) and the kernel's shape.
template <typename T, typename Idx>
class StitchMatMulOpBase : public StitchConcatOpBase {
 public:
  explicit StitchMatMulOpBase(OpKernelConstruction* ctx) : StitchConcatOpBase(ctx) {}

 protected:
  struct Inputs : ConcatInputs<T, Idx> {
    int64_t units = 0;
  };

  Status Read(OpKernelContext* ctx, int first_rows, const Tensor& kernel, Inputs* in) const {
    TF_RETURN_IF_ERROR(this->ReadInputs(ctx, first_rows, /*validate_inverse=*/false, in));
    if (kernel.dims() != 2 || kernel.dim_size(0) != in->width) {
      return errors::InvalidArgument(
          "StitchConcatMatMul: kernel must be a matrix [", in->width,
          ", units] (one row per column of the concatenation), got ", kernel.shape().DebugString(),
          "; the dense layer's input width must equal the concatenated width.");
    }
    in->units = kernel.dim_size(1);
    return Status();
  }
};

template <typename T, typename Idx>
class StitchConcatMatMulCpuOp : public StitchMatMulOpBase<T, Idx> {
 public:
  explicit StitchConcatMatMulCpuOp(OpKernelConstruction* ctx) : StitchMatMulOpBase<T, Idx>(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& kernel = ctx->input(5 * this->num_groups_ + this->num_dense_);
    typename StitchMatMulOpBase<T, Idx>::Inputs in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 0, kernel, &in));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({in.batch, in.units}), &output));
    OP_REQUIRES_OK(ctx, ToTfStatus(ForwardConcatMatMul<T, Idx>(
                            in.groups, in.pieces, in.batch, kernel.flat<T>().data(), in.units,
                            output->flat<T>().data(), CpuParallelFor(ctx))));
  }
};

template <typename T, typename Idx>
class StitchConcatMatMulGradCpuOp : public StitchMatMulOpBase<T, Idx> {
 public:
  explicit StitchConcatMatMulGradCpuOp(OpKernelConstruction* ctx)
      : StitchMatMulOpBase<T, Idx>(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int ng = static_cast<int>(this->num_groups_);
    const Tensor& grad = ctx->input(0);
    const Tensor& kernel = ctx->input(1);
    typename StitchMatMulOpBase<T, Idx>::Inputs in;
    OP_REQUIRES_OK(ctx, this->Read(ctx, 2, kernel, &in));
    OP_REQUIRES(ctx,
                grad.dims() == 2 && grad.dim_size(0) == in.batch && grad.dim_size(1) == in.units,
                errors::InvalidArgument("grad must have shape [", in.batch, ", ", in.units,
                                        "], got ", grad.shape().DebugString(), "."));
    std::vector<T*> d_rows(ng);
    for (int g = 0; g < ng; ++g) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(g, ctx->input(2 + g).shape(), &out));
      d_rows[g] = out->flat<T>().data();
    }
    std::vector<T*> d_pieces(in.pieces.size(), nullptr);
    for (size_t k = 0; k < in.pieces.size(); ++k) {
      if (this->piece_groups_[k] >= 0) continue;
      const int64_t m = this->piece_items_[k];
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(ng + static_cast<int>(m),
                                               ctx->input(2 + 5 * ng + m).shape(), &out));
      d_pieces[k] = out->flat<T>().data();
    }
    Tensor* d_kernel = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(ng + static_cast<int>(this->num_dense_),
                                             kernel.shape(), &d_kernel));
    OP_REQUIRES_OK(ctx, ToTfStatus(BackwardConcatMatMul<T, Idx>(
                            in.groups, in.pieces, in.batch, kernel.flat<T>().data(), in.units,
                            grad.flat<T>().data(), d_rows, d_pieces, d_kernel->flat<T>().data(),
                            CpuParallelFor(ctx))));
  }
};

#define HYBRIDTF_REGISTER_CPU(T, Idx)                                 \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchConcatMatMul"))     \
                              .Device(::tensorflow::DEVICE_CPU)       \
                              .TypeConstraint<T>("T")                 \
                              .TypeConstraint<Idx>("Tidx"),           \
                          StitchConcatMatMulCpuOp<T, Idx>);           \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchConcatMatMulGrad")) \
                              .Device(::tensorflow::DEVICE_CPU)       \
                              .TypeConstraint<T>("T")                 \
                              .TypeConstraint<Idx>("Tidx"),           \
                          StitchConcatMatMulGradCpuOp<T, Idx>);

HYBRIDTF_REGISTER_CPU(float, int32_t)
HYBRIDTF_REGISTER_CPU(float, int64_t)
HYBRIDTF_REGISTER_CPU(double, int32_t)
HYBRIDTF_REGISTER_CPU(double, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace stitch_combine
}  // namespace hybridtf
