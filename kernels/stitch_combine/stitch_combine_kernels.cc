// CPU kernels of HybridTF>StitchCombine and HybridTF>StitchCombineGrad: thin
// OpKernels over the TF-free stitch_combine implementation layer.
#include "kernels/stitch_combine/stitch_combine_kernels.h"

#include <string>
#include <utility>
#include <vector>

#include "kernels/common/checked_math.h"
#include "kernels/common/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {
namespace stitch_combine {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename T, typename Idx>
class StitchCombineCpuOp : public StitchCombineOpBase {
 public:
  explicit StitchCombineCpuOp(OpKernelConstruction* ctx) : StitchCombineOpBase(ctx) {
    std::vector<::tensorflow::PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("id_shapes", &shapes));
    OP_REQUIRES(ctx, shapes.empty() || static_cast<int64_t>(shapes.size()) == num_fields_,
                ::tensorflow::errors::InvalidArgument("id_shapes has ", shapes.size(),
                                                      " entries but num_fields is ", num_fields_,
                                                      "; give one per field or none."));
    for (size_t f = 0; f < shapes.size(); ++f) {
      id_shaped_.push_back(!shapes[f].unknown_rank());
      std::vector<int64_t> dims;
      for (int d = 0; id_shaped_[f] && d < shapes[f].dims(); ++d)
        dims.push_back(shapes[f].dim_size(d));
      id_shapes_.push_back(std::move(dims));
      OP_REQUIRES(ctx, !id_shaped_[f] || combiners_[f] == Combiner::kNone,
                  ::tensorflow::errors::InvalidArgument(
                      "id_shapes[", f, "] has a known rank but field ", f,
                      " is a bag; only one-hot fields take their ids' shape."));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    OP_REQUIRES(
        ctx, rows.dims() == 2,
        ::tensorflow::errors::InvalidArgument("rows must be a matrix [num_unique, dim], got ",
                                              rows.shape().DebugString(), "."));
    Layout layout;
    OP_REQUIRES_OK(ctx, BuildLayout<T>(ctx, 1, &layout));
    const Tensor& inverse = ctx->input(1);
    const int64_t dim = rows.dim_size(1);
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(ValidateInverse(inverse.flat<Idx>().data(), inverse.NumElements(),
                                              rows.dim_size(0), CpuParallelFor(ctx))));
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("outputs", &outputs));
    std::vector<T*> out(num_fields_);
    for (int f = 0; f < num_fields_; ++f) {
      Tensor* t = nullptr;
      TensorShape shape;
      OP_REQUIRES_OK(ctx, OutputShape(f, layout.output_rows(f), dim, &shape));
      OP_REQUIRES_OK(ctx, outputs.allocate(f, shape, &t));
      out[f] = t->flat<T>().data();
    }
    const Tensor& weights = ctx->input(5);
    Forward<T, Idx>(layout, rows.flat<T>().data(), dim, inverse.flat<Idx>().data(),
                    weights.NumElements() ? weights.flat<T>().data() : nullptr, out.data(),
                    CpuParallelFor(ctx));
  }

 private:
  // [rows, dim], or the field's ids' shape (id_shapes) plus [dim].
  ::tensorflow::Status OutputShape(int f, int64_t rows, int64_t dim, TensorShape* shape) const {
    const std::string what = "outputs[" + std::to_string(f) + "]";
    if (id_shaped_.empty() || !id_shaped_[f]) return MatrixShape(rows, dim, what, shape);
    std::vector<int64_t> dims;
    TF_RETURN_IF_ERROR(ToTfStatus(OutputDims(id_shapes_[f], rows, dim, f, &dims)));
    const ::tensorflow::Status s = TensorShape::BuildTensorShape(dims, shape);
    if (s.ok()) return s;
    return ::tensorflow::errors::InvalidArgument(what, " is not a valid tensor shape (",
                                                 s.message(), "); check id_shapes[", f, "].");
  }

  std::vector<bool> id_shaped_;
  std::vector<std::vector<int64_t>> id_shapes_;
};

template <typename T, typename Idx>
class StitchCombineGradCpuOp : public StitchCombineOpBase {
 public:
  explicit StitchCombineGradCpuOp(OpKernelConstruction* ctx) : StitchCombineOpBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int nf = static_cast<int>(num_fields_);
    Layout layout;
    OP_REQUIRES_OK(ctx, BuildLayout<T>(ctx, nf, &layout));
    const Tensor& inverse = ctx->input(nf);
    const Tensor& num_unique_t = ctx->input(nf + 5);
    OP_REQUIRES(ctx, num_unique_t.dims() == 0,
                ::tensorflow::errors::InvalidArgument("num_unique must be a scalar."));
    const int64_t num_unique = num_unique_t.scalar<int64_t>()();
    OP_REQUIRES(
        ctx, num_unique >= 0,
        ::tensorflow::errors::InvalidArgument("num_unique must be >= 0, got ", num_unique, "."));
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(ValidateInverse(inverse.flat<Idx>().data(), inverse.NumElements(),
                                              num_unique, CpuParallelFor(ctx))));
    int64_t dim = -1;
    std::vector<const T*> grads(nf);
    for (int f = 0; f < nf; ++f) {
      const Tensor& g = ctx->input(f);
      // [rows_f, dim], or (a one-hot field with id_shapes) [ids' shape..., dim]: rows_f rows of
      // dim.
      bool ok = g.dims() >= 2;
      int64_t lead = 1;
      for (int d = 0; ok && d + 1 < g.dims(); ++d) ok = CheckedMul(lead, g.dim_size(d), &lead);
      const int64_t last = g.dims() >= 2 ? g.dim_size(g.dims() - 1) : -1;
      OP_REQUIRES(ctx, ok && lead == layout.output_rows(f),
                  ::tensorflow::errors::InvalidArgument(
                      "grads[", f, "] must have shape [", layout.output_rows(f),
                      ", dim] (or its ids' shape plus [dim], with as many ids), got ",
                      g.shape().DebugString(), "."));
      OP_REQUIRES(ctx, dim < 0 || last == dim,
                  ::tensorflow::errors::InvalidArgument("all grads must have the same dim."));
      dim = last;
      grads[f] = g.flat<T>().data();
    }
    Tensor* d_rows = nullptr;
    TensorShape shape;
    OP_REQUIRES_OK(ctx, MatrixShape(num_unique, dim, "d_rows (num_unique, dim)", &shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &d_rows));
    const Tensor& weights = ctx->input(nf + 4);
    Backward<T, Idx>(layout, grads.data(), dim, inverse.flat<Idx>().data(),
                     weights.NumElements() ? weights.flat<T>().data() : nullptr, num_unique,
                     d_rows->flat<T>().data(), CpuParallelFor(ctx));
  }
};

#define HYBRIDTF_REGISTER_CPU(T, Idx)                            \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchCombine"))     \
                              .Device(::tensorflow::DEVICE_CPU)  \
                              .TypeConstraint<T>("T")            \
                              .TypeConstraint<Idx>("Tidx"),      \
                          StitchCombineCpuOp<T, Idx>);           \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("StitchCombineGrad")) \
                              .Device(::tensorflow::DEVICE_CPU)  \
                              .TypeConstraint<T>("T")            \
                              .TypeConstraint<Idx>("Tidx"),      \
                          StitchCombineGradCpuOp<T, Idx>);

HYBRIDTF_REGISTER_CPU(float, int32_t)
HYBRIDTF_REGISTER_CPU(float, int64_t)
HYBRIDTF_REGISTER_CPU(double, int32_t)
HYBRIDTF_REGISTER_CPU(double, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace stitch_combine
}  // namespace hybridtf
