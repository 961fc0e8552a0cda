// CPU kernels of the regularized fused updates: thin OpKernels over the
// TF-free regularized_apply layer (in-place, under the variables' mutexes).
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_locked_vars.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/regularized_apply/regularized_apply_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace hybridtf {
namespace regularized_apply {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
namespace errors = ::tensorflow::errors;

template <typename Idx>
class RegularizedApplyOp : public OpKernel {
 public:
  RegularizedApplyOp(OpKernelConstruction* ctx, Kind kind) : OpKernel(ctx), kind_(kind) {
    if (kind_ == Kind::kAdam) {
      bool lazy = false;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("lazy", &lazy));
      if (lazy) kind_ = Kind::kLazyAdam;
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const bool adam = kind_ == Kind::kAdam || kind_ == Kind::kLazyAdam;
    const int num_vars = kind_ == Kind::kSgd ? 1 : (kind_ == Kind::kAdagrad ? 2 : 3);
    const int num_scalars = kind_ == Kind::kSgd ? 1 : (kind_ == Kind::kAdagrad ? 2 : 4);
    std::vector<float> s;
    for (int i = num_vars; i < num_vars + num_scalars; ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES(ctx, t.dims() == 0,
                  errors::InvalidArgument("input ", i, " (a hyperparameter) must be a scalar, got ",
                                          "shape ", t.shape().DebugString(), "."));
      s.push_back(t.scalar<float>()());
    }
    const int g_in = num_vars + num_scalars;
    const Tensor& grad = ctx->input(g_in);
    const Tensor& indices = ctx->input(g_in + 1);
    const Tensor& ranges = ctx->input(g_in + 2);
    const Tensor& l1 = ctx->input(g_in + 3);
    const Tensor& l2 = ctx->input(g_in + 4);
    OP_REQUIRES(
        ctx, indices.dims() == 1 && grad.dims() == 2 && grad.dim_size(0) == indices.dim_size(0),
        errors::InvalidArgument("grad must be [num_indices, dim] and indices a vector, got ",
                                grad.shape().DebugString(), " and ", indices.shape().DebugString(),
                                "."));
    OP_REQUIRES(ctx,
                ranges.dims() == 2 && ranges.dim_size(1) == 2 && l1.dims() == 1 && l2.dims() == 1 &&
                    l1.dim_size(0) == ranges.dim_size(0) && l2.dim_size(0) == ranges.dim_size(0),
                errors::InvalidArgument(
                    "reg_ranges must be [num_ranges, 2] and reg_l1, reg_l2 [num_ranges], got ",
                    ranges.shape().DebugString(), ", ", l1.shape().DebugString(), ", ",
                    l2.shape().DebugString(), "."));
    TfLockedVars vars(ctx, num_vars);
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
    const int64_t rows = shape.dim_size(0);
    std::vector<RegRange> regs(static_cast<size_t>(ranges.dim_size(0)));
    const auto r = ranges.matrix<int64_t>();
    for (size_t k = 0; k < regs.size(); ++k) {
      regs[k] = RegRange{r(k, 0), r(k, 1), l1.flat<float>()(k), l2.flat<float>()(k)};
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(ValidateRanges(regs, rows)));
    SparseGrad<Idx> g{indices.flat<Idx>().data(), grad.flat<float>().data(), grad.dim_size(0),
                      grad.dim_size(1)};
    OP_REQUIRES_OK(ctx, ToTfStatus(sparse_apply::ValidateIndices(g, rows)));
    std::vector<Idx> sorted_indices;
    std::vector<float> sorted_values;
    if (!Ascending(g)) g = SortedCopy(g, &sorted_indices, &sorted_values);
    Hyper h;
    if (adam) {
      h.alpha = s[0];
      h.c1 = s[1];
      h.c2 = s[2];
      h.eps = s[3];
    } else {
      h.lr = s[0];
      if (kind_ == Kind::kAdagrad) h.eps = s[1];
    }
    Apply(kind_, vars.data(0), num_vars > 1 ? vars.data(1) : nullptr,
          num_vars > 2 ? vars.data(2) : nullptr, rows, g, regs, h, CpuParallelFor(ctx));
  }

 private:
  Kind kind_;
};

template <typename Idx>
class SgdOp : public RegularizedApplyOp<Idx> {
 public:
  explicit SgdOp(OpKernelConstruction* ctx) : RegularizedApplyOp<Idx>(ctx, Kind::kSgd) {}
};
template <typename Idx>
class AdagradOp : public RegularizedApplyOp<Idx> {
 public:
  explicit AdagradOp(OpKernelConstruction* ctx) : RegularizedApplyOp<Idx>(ctx, Kind::kAdagrad) {}
};
template <typename Idx>
class AdamOp : public RegularizedApplyOp<Idx> {
 public:
  explicit AdamOp(OpKernelConstruction* ctx) : RegularizedApplyOp<Idx>(ctx, Kind::kAdam) {}
};

// The penalties' values: reads the variable under its shared lock (like ResourceGather).
class RegularizationPenaltyOp : public OpKernel {
 public:
  explicit RegularizationPenaltyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ranges = ctx->input(1);
    const Tensor& l1 = ctx->input(2);
    const Tensor& l2 = ctx->input(3);
    OP_REQUIRES(ctx,
                ranges.dims() == 2 && ranges.dim_size(1) == 2 && l1.dims() == 1 && l2.dims() == 1 &&
                    l1.dim_size(0) == ranges.dim_size(0) && l2.dim_size(0) == ranges.dim_size(0),
                errors::InvalidArgument(
                    "reg_ranges must be [num_ranges, 2] and reg_l1, reg_l2 [num_ranges], got ",
                    ranges.shape().DebugString(), ", ", l1.shape().DebugString(), ", ",
                    l2.shape().DebugString(), "."));
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
    OP_REQUIRES_OK(ctx,
                   ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &var));
    ::tensorflow::tf_shared_lock lock(*var->mu());
    const Tensor* table = var->tensor();
    OP_REQUIRES(ctx, table->IsInitialized(),
                errors::FailedPrecondition("the table variable of RegularizationPenalty is not "
                                           "initialized; initialize the model's variables first."));
    OP_REQUIRES(ctx, table->dtype() == ::tensorflow::DT_FLOAT && table->dims() == 2,
                errors::InvalidArgument(
                    "RegularizationPenalty takes a float32 table variable [rows, dim], got ",
                    ::tensorflow::DataTypeString(table->dtype()), " of shape ",
                    table->shape().DebugString(), "."));
    std::vector<RegRange> regs(static_cast<size_t>(ranges.dim_size(0)));
    const auto r = ranges.matrix<int64_t>();
    for (size_t k = 0; k < regs.size(); ++k) {
      regs[k] = RegRange{r(k, 0), r(k, 1), l1.flat<float>()(k), l2.flat<float>()(k)};
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, ::tensorflow::TensorShape({ranges.dim_size(0)}), &out));
    OP_REQUIRES_OK(ctx, ToTfStatus(Penalties(table->flat<float>().data(), table->dim_size(0),
                                             table->dim_size(1), regs, out->flat<float>().data(),
                                             CpuParallelFor(ctx))));
  }
};

REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("RegularizationPenalty")).Device(::tensorflow::DEVICE_CPU),
                        RegularizationPenaltyOp);

#define HYBRIDTF_REGISTER(op_name, Op, Idx)                                                    \
  REGISTER_KERNEL_BUILDER(                                                                     \
      Name(HYBRIDTF_OP(op_name)).Device(::tensorflow::DEVICE_CPU).TypeConstraint<Idx>("Tidx"), \
      Op<Idx>);

#define HYBRIDTF_REGISTER_ALL(Idx)                             \
  HYBRIDTF_REGISTER("RegularizedApplySgd", SgdOp, Idx)         \
  HYBRIDTF_REGISTER("RegularizedApplyAdagrad", AdagradOp, Idx) \
  HYBRIDTF_REGISTER("RegularizedApplyAdam", AdamOp, Idx)

HYBRIDTF_REGISTER_ALL(int32_t)
HYBRIDTF_REGISTER_ALL(int64_t)
#undef HYBRIDTF_REGISTER_ALL
#undef HYBRIDTF_REGISTER

}  // namespace regularized_apply
}  // namespace hybridtf
