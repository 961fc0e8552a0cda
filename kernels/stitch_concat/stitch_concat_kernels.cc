// CPU kernels of HybridTF>StitchConcat and HybridTF>StitchConcatGrad: the
// stitch_combine implementation layer writing into (and reading from) column
// ranges of one concatenated matrix instead of per-field outputs.
#include "kernels/stitch_concat/stitch_concat_kernels.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_concat/stitch_concat_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

// Copies the [batch, w] matrix src into columns [col, col + w) of dst ([batch, width]), or back.
template <typename T>
void CopyColumns(OpKernelContext* ctx, const T* src, int64_t src_stride, T* dst, int64_t dst_stride,
                 int64_t batch, int64_t w) {
  CpuParallelFor(ctx)(batch, 2 * w, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      std::copy(src + b * src_stride, src + b * src_stride + w, dst + b * dst_stride);
    }
  });
}

template <typename T, typename Idx>
class StitchConcatCpuOp : public StitchConcatOpBase {
 public:
  explicit StitchConcatCpuOp(OpKernelConstruction* ctx) : StitchConcatOpBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ConcatInputs<T, Idx> in;
    OP_REQUIRES_OK(ctx, ReadInputs(ctx, 0, /*validate_inverse=*/true, &in));
    Tensor* output = nullptr;
    TensorShape shape;
    OP_REQUIRES_OK(ctx, MatrixShape(in.batch, in.width, "StitchConcat's output", &shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &output));
    ForwardConcat<T, Idx>(in.groups, in.pieces, in.batch, in.width, output->flat<T>().data(),
                          CpuParallelFor(ctx));
  }
};

template <typename T, typename Idx>
class StitchConcatGradCpuOp : public StitchConcatOpBase {
 public:
  explicit StitchConcatGradCpuOp(OpKernelConstruction* ctx) : StitchConcatOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dense_widths", &dense_widths_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("broadcast_grad", &broadcast_));
    OP_REQUIRES(
        ctx,
        static_cast<int64_t>(dims_.size()) == num_groups_ &&
            static_cast<int64_t>(dense_widths_.size()) == num_dense_,
        errors::InvalidArgument("dims needs num_groups and dense_widths num_dense entries."));
    for (const auto& [list, what] :
         {std::pair<const std::vector<int64_t>*, const char*>{&dims_, "dims"},
          {&dense_widths_, "dense_widths"}}) {
      for (size_t i = 0; i < list->size(); ++i) {
        OP_REQUIRES(ctx, (*list)[i] >= 0 && (*list)[i] <= kMaxWidth,
                    errors::InvalidArgument(what, "[", i, "] = ", (*list)[i], " must be in [0, ",
                                            kMaxWidth, "] (a column count)."));
      }
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int ng = static_cast<int>(num_groups_);
    std::vector<Layout> layouts;
    OP_REQUIRES_OK(ctx, BuildLayouts(ctx, 1, &layouts));
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES(
        ctx, grad.dims() == 2,
        errors::InvalidArgument("grad must be a matrix, got ", grad.shape().DebugString(), "."));
    std::vector<int64_t> dense_rows(num_dense_, grad.dim_size(0));
    std::vector<int64_t> columns;
    int64_t width = 0, batch = 0;
    OP_REQUIRES_OK(
        ctx, PlacePieces(layouts, dims_, dense_rows, dense_widths_, &columns, &width, &batch));
    // broadcast_grad: grad is [batch, 1], the gradient of every column of its row.
    OP_REQUIRES(
        ctx, grad.dim_size(0) == batch && grad.dim_size(1) == (broadcast_ ? 1 : width),
        errors::InvalidArgument("grad must have shape [", batch, ", ", broadcast_ ? 1 : width, "]",
                                broadcast_ ? " (broadcast_grad)" : "", ", got ",
                                grad.shape().DebugString(), "."));
    const T* g_all = grad.flat<T>().data();
    std::vector<ConcatGroup<T, Idx>> groups;
    std::vector<int64_t> num_unique(ng);
    std::vector<T*> d_rows(ng);
    for (int g = 0; g < ng; ++g) {
      const Tensor& num_unique_t = ctx->input(1 + 4 * ng + g);
      OP_REQUIRES(ctx, num_unique_t.dims() == 0,
                  errors::InvalidArgument("num_unique must be scalars."));
      num_unique[g] = num_unique_t.scalar<int64_t>()();
      OP_REQUIRES(ctx, num_unique[g] >= 0,
                  errors::InvalidArgument("num_unique must be >= 0, got ", num_unique[g]));
      const Tensor& inverse = ctx->input(1 + g);  // validated by BackwardConcat
      Tensor* out = nullptr;
      TensorShape shape;
      OP_REQUIRES_OK(ctx,
                     MatrixShape(num_unique[g], dims_[g],
                                 "d_rows[" + std::to_string(g) + "] (num_unique, dims)", &shape));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(g, shape, &out));
      d_rows[g] = out->flat<T>().data();
      groups.push_back({&layouts[g], nullptr, dims_[g], inverse.flat<Idx>().data(), num_unique[g]});
    }
    std::vector<ConcatPiece<T>> pieces;
    for (size_t k = 0; k < columns.size(); ++k) {
      const int64_t g = piece_groups_[k], item = piece_items_[k];
      pieces.push_back({static_cast<int>(g), g < 0 ? -1 : static_cast<int>(item), nullptr,
                        g < 0 ? dense_widths_[item] : dims_[g], columns[k]});
    }
    OP_REQUIRES_OK(
        ctx, ToTfStatus(BackwardConcat<T, Idx>(groups, pieces, num_unique, batch, width, g_all,
                                               broadcast_, d_rows, CpuParallelFor(ctx))));
    for (size_t k = 0; k < columns.size(); ++k) {
      if (piece_groups_[k] >= 0) continue;
      const int64_t m = piece_items_[k];
      Tensor* d_dense = nullptr;
      TensorShape shape;
      OP_REQUIRES_OK(
          ctx, MatrixShape(batch, dense_widths_[m], "d_dense[" + std::to_string(m) + "]", &shape));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(ng + m, shape, &d_dense));
      T* dst = d_dense->flat<T>().data();
      const int64_t w = dense_widths_[m];
      if (broadcast_) {  // every column of row b is grad[b]
        CpuParallelFor(ctx)(batch, w, [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) std::fill(dst + b * w, dst + (b + 1) * w, g_all[b]);
        });
        continue;
      }
      CopyColumns<T>(ctx, g_all + columns[k], width, dst, w, batch, w);
    }
  }

 private:
  std::vector<int64_t> dims_;
  std::vector<int64_t> dense_widths_;
  bool broadcast_ = false;
};

#define HYBRIDTF_REGISTER_CPU(T, Idx)                           \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchConcat"))     \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Idx>("Tidx"),     \
                          StitchConcatCpuOp<T, Idx>);           \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchConcatGrad")) \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<T>("T")           \
                              .TypeConstraint<Idx>("Tidx"),     \
                          StitchConcatGradCpuOp<T, Idx>);

HYBRIDTF_REGISTER_CPU(float, int32_t)
HYBRIDTF_REGISTER_CPU(float, int64_t)
HYBRIDTF_REGISTER_CPU(double, int32_t)
HYBRIDTF_REGISTER_CPU(double, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace stitch_combine
}  // namespace hybridtf
