// CPU kernels of the fused sparse optimizer updates: thin OpKernels over the
// TF-free sparse_apply layer. They update resource variables in place under
// the variables' mutexes (TfLockedVars: aliasing rejected, copy on write).
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_locked_vars.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/sparse_apply/sparse_apply_impl.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {
namespace sparse_apply {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
namespace errors = ::tensorflow::errors;

namespace {

// Names of the variable inputs, in input order (var, then the slots; the
// Adagrad op's second input is its accumulator, Adam's are m and v).
constexpr const char* kVarNames[] = {"var", "slot 1 (accum / m)", "slot 2 (v)"};

float Scalar(OpKernelContext* ctx, int i, ::tensorflow::Status* status) {
  const Tensor& t = ctx->input(i);
  if (t.dims() != 0) {
    *status = errors::InvalidArgument("input ", i, " must be a scalar, got shape ",
                                      t.shape().DebugString(), ".");
    return 0.f;
  }
  return t.scalar<float>()();
}

}  // namespace

template <typename Idx>
class SparseApplyOp : public OpKernel {
 public:
  enum class Kind { kSgd, kAdagrad, kAdam };
  SparseApplyOp(OpKernelConstruction* ctx, Kind kind) : OpKernel(ctx), kind_(kind) {
    if (kind_ == Kind::kAdam) OP_REQUIRES_OK(ctx, ctx->GetAttr("lazy", &lazy_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_vars = kind_ == Kind::kSgd ? 1 : (kind_ == Kind::kAdagrad ? 2 : 3);
    const int first_scalar = num_vars;
    const int num_scalars = kind_ == Kind::kSgd ? 1 : (kind_ == Kind::kAdagrad ? 2 : 4);
    const Tensor& grad = ctx->input(first_scalar + num_scalars);
    const Tensor& indices = ctx->input(first_scalar + num_scalars + 1);
    ::tensorflow::Status status;
    std::vector<float> s;
    for (int i = 0; i < num_scalars; ++i) s.push_back(Scalar(ctx, first_scalar + i, &status));
    OP_REQUIRES_OK(ctx, status);
    OP_REQUIRES(
        ctx, indices.dims() == 1 && grad.dims() == 2 && grad.dim_size(0) == indices.dim_size(0),
        errors::InvalidArgument("grad must be [num_indices, dim] and indices a vector, got ",
                                grad.shape().DebugString(), " and ", indices.shape().DebugString(),
                                "."));
    TfLockedVars vars(ctx, num_vars, kVarNames);
    OP_REQUIRES_OK(ctx, vars.status());
    const auto& shape = vars.shape(0);
    OP_REQUIRES(
        ctx, shape.dims() == 2 && shape.dim_size(1) == grad.dim_size(1),
        errors::InvalidArgument("variable shape ", shape.DebugString(),
                                " does not match gradient rows of width ", grad.dim_size(1), "."));
    for (int i = 1; i < num_vars; ++i) {
      OP_REQUIRES(
          ctx, vars.shape(i) == shape,
          errors::InvalidArgument("slot variable shape ", vars.shape(i).DebugString(),
                                  " differs from the variable's ", shape.DebugString(), "."));
    }
    SparseGrad<Idx> g{indices.flat<Idx>().data(), grad.flat<float>().data(), grad.dim_size(0),
                      grad.dim_size(1)};
    OP_REQUIRES_OK(ctx, ToTfStatus(ValidateIndices(g, shape.dim_size(0))));
    const ParallelFor pf = CpuParallelFor(ctx);
    switch (kind_) {
      case Kind::kSgd:
        Sgd(vars.data(0), g, s[0], pf);
        break;
      case Kind::kAdagrad:
        Adagrad(vars.data(0), vars.data(1), g, s[0], s[1], pf);
        break;
      case Kind::kAdam:
        if (lazy_) {
          LazyAdam(vars.data(0), vars.data(1), vars.data(2), g, s[0], s[1], s[2], s[3], pf);
        } else {
          Adam(vars.data(0), vars.data(1), vars.data(2), shape.dim_size(0), g, s[0], s[1], s[2],
               s[3], pf);
        }
        break;
    }
  }

 private:
  Kind kind_;
  bool lazy_ = false;
};

template <typename Idx>
class SgdOp : public SparseApplyOp<Idx> {
 public:
  explicit SgdOp(OpKernelConstruction* ctx)
      : SparseApplyOp<Idx>(ctx, SparseApplyOp<Idx>::Kind::kSgd) {}
};
template <typename Idx>
class AdagradOp : public SparseApplyOp<Idx> {
 public:
  explicit AdagradOp(OpKernelConstruction* ctx)
      : SparseApplyOp<Idx>(ctx, SparseApplyOp<Idx>::Kind::kAdagrad) {}
};
template <typename Idx>
class AdamOp : public SparseApplyOp<Idx> {
 public:
  explicit AdamOp(OpKernelConstruction* ctx)
      : SparseApplyOp<Idx>(ctx, SparseApplyOp<Idx>::Kind::kAdam) {}
};

#define HYBRIDTF_REGISTER(op_name, Op, Idx)                                                    \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name(HYBRIDTF_OP(op_name)).Device(::tensorflow::DEVICE_CPU).TypeConstraint<Idx>("Tidx"), \
      Op<Idx>);

#define HYBRIDTF_REGISTER_ALL(Idx)                        \
  HYBRIDTF_REGISTER("SparseApplySgd", SgdOp, Idx)         \
  HYBRIDTF_REGISTER("SparseApplyAdagrad", AdagradOp, Idx) \
  HYBRIDTF_REGISTER("SparseApplyAdam", AdamOp, Idx)

HYBRIDTF_REGISTER_ALL(int32_t)
HYBRIDTF_REGISTER_ALL(int64_t)
#undef HYBRIDTF_REGISTER_ALL
#undef HYBRIDTF_REGISTER

}  // namespace sparse_apply
}  // namespace hybridtf
