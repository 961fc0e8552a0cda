// CPU kernels of HybridTF>StitchConcatMatMul and StitchConcatMatMulGrad: the
// stitch_matmul implementation layer behind StitchConcat's layout attributes.
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_combine/stitch_combine_impl.h"
#include "kernels/stitch_combine/stitch_concat_kernels.h"
#include "kernels/stitch_combine/stitch_matmul_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

// Shared input checks: the layouts, rows, inverses and dense inputs starting at
// input `first_rows` (rows, inverses, sizes, segments, lengths, dense), the
// pieces' columns and the kernel's shape.
template <typename T, typename Idx>
class StitchMatMulOpBase : public StitchConcatOpBase {
 public:
  explicit StitchMatMulOpBase(OpKernelConstruction* ctx) : StitchConcatOpBase(ctx) {}

 protected:
  struct Inputs {
    std::vector<Layout> layouts;
    std::vector<ConcatGroup<T, Idx>> groups;
    std::vector<ConcatPiece<T>> pieces;
    int64_t batch = 0;
    int64_t width = 0;
    int64_t units = 0;
  };

  Status Read(OpKernelContext* ctx, int first_rows, const Tensor& kernel, Inputs* in) const {
    const int ng = static_cast<int>(num_groups_);
    TF_RETURN_IF_ERROR(BuildLayouts(ctx, first_rows + ng, &in->layouts));
    std::vector<int64_t> dims(ng), dense_rows(num_dense_), dense_widths(num_dense_);
    for (int g = 0; g < ng; ++g) {
      const Tensor& rows = ctx->input(first_rows + g);
      if (rows.dims() != 2) {
        return errors::InvalidArgument("rows[", g, "] must be a matrix [num_unique, dim], got ",
                                       rows.shape().DebugString(), ".");
      }
      dims[g] = rows.dim_size(1);  // inverse indices: checked by the implementation layer
    }
    for (int64_t m = 0; m < num_dense_; ++m) {
      const Tensor& d = ctx->input(first_rows + 5 * ng + m);
      if (d.dims() != 2) {
        return errors::InvalidArgument("dense[", m, "] must be a matrix [batch, width], got ",
                                       d.shape().DebugString(), ".");
      }
      dense_rows[m] = d.dim_size(0);
      dense_widths[m] = d.dim_size(1);
    }
    std::vector<int64_t> columns;
    TF_RETURN_IF_ERROR(
        PlacePieces(in->layouts, dims, dense_rows, dense_widths, &columns, &in->width, &in->batch));
    if (kernel.dims() != 2 || kernel.dim_size(0) != in->width) {
      return errors::InvalidArgument(
          "StitchConcatMatMul: kernel must be a matrix [", in->width,
          ", units] (one row per column of the concatenation), got ", kernel.shape().DebugString(),
          "; the dense layer's input width must equal the concatenated width.");
    }
    in->units = kernel.dim_size(1);
    for (int g = 0; g < ng; ++g) {
      const Tensor& rows = ctx->input(first_rows + g);
      in->groups.push_back({&in->layouts[g], rows.flat<T>().data(), dims[g],
                            ctx->input(first_rows + ng + g).flat<Idx>().data(), rows.dim_size(0)});
    }
    for (size_t k = 0; k < columns.size(); ++k) {
      const int64_t g = piece_groups_[k], item = piece_items_[k];
      in->pieces.push_back(
          {static_cast<int>(g), g < 0 ? -1 : static_cast<int>(item),
           g < 0 ? ctx->input(first_rows + 5 * ng + item).flat<T>().data() : nullptr,
           g < 0 ? dense_widths[item] : dims[g], columns[k]});
    }
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
