// CPU kernel of GatherRows: a thin OpKernel over the TF-free gather_rows layer.
// It reads the variable under its shared lock (as ResourceGather does).
#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/gather_rows/gather_rows_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace hybridtf {
namespace gather_rows {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
namespace errors = ::tensorflow::errors;

template <typename T, typename Idx>
class GatherRowsOp : public OpKernel {
 public:
  explicit GatherRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, indices.dims() == 1,
                errors::InvalidArgument("indices must be a vector, got shape ",
                                        indices.shape().DebugString(), "."));
    ::tensorflow::core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx,
                   ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, 0), &var));
    ::tensorflow::tf_shared_lock lock(*var->mu());
    const Tensor* table = var->tensor();
    OP_REQUIRES(ctx, table->IsInitialized(),
                errors::FailedPrecondition("the table variable of GatherRows is not initialized."));
    OP_REQUIRES(ctx, table->dtype() == ::tensorflow::DataTypeToEnum<T>::v(),
                errors::InvalidArgument(
                    "the table variable is ", ::tensorflow::DataTypeString(table->dtype()),
                    ", but GatherRows was built for ",
                    ::tensorflow::DataTypeString(::tensorflow::DataTypeToEnum<T>::v()),
                    "; pass dtype=variable.dtype."));
    OP_REQUIRES(
        ctx, table->dims() == 2,
        errors::InvalidArgument("the table variable must be a matrix [rows, dim], got shape ",
                                table->shape().DebugString(), "."));
    const int64_t n = indices.dim_size(0), rows = table->dim_size(0), dim = table->dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(GatherRows(table->flat<T>().data(), rows, dim, indices.flat<Idx>().data(),
                                   n, out->flat<T>().data(), CpuParallelFor(ctx))));
  }
};

#define HYBRIDTF_REGISTER(T, Idx)                               \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("GatherRows"))       \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<T>("dtype")       \
                              .TypeConstraint<Idx>("Tidx"),     \
                          GatherRowsOp<T, Idx>);
HYBRIDTF_REGISTER(float, int32_t)
HYBRIDTF_REGISTER(float, int64_t)
HYBRIDTF_REGISTER(double, int32_t)
HYBRIDTF_REGISTER(double, int64_t)
#undef HYBRIDTF_REGISTER

}  // namespace gather_rows
}  // namespace hybridtf
