// CPU kernel of HybridTF>BagSplits over the TF-free bag_splits layer.
#include <string>

#include "kernels/bag_splits/bag_splits_impl.h"
#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_status.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {
namespace bag_splits {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;

class BagSplitsCpuOp : public OpKernel {
 public:
  explicit BagSplitsCpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string kind;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kind", &kind));
    from_rows_ = kind == "row_ids";
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table", &table_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& nrows = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() == 1 && rows.dims() == 1 && nrows.dims() == 0,
                InvalidArgument("embedding table '", table_,
                                "': BagSplits takes vectors of values and rows and a scalar nrows, "
                                "got ",
                                values.shape().DebugString(), ", ", rows.shape().DebugString(),
                                " and ", nrows.shape().DebugString(), "."));
    const int64_t n = values.dim_size(0);
    ctx->set_output(0, values);
    if (!from_rows_) {
      OP_REQUIRES_OK(
          ctx, ToTfStatus(CheckSplits(rows.flat<int64_t>().data(), rows.dim_size(0), n, table_)));
      ctx->set_output(1, rows);
      return;
    }
    OP_REQUIRES(ctx, rows.dim_size(0) == n,
                InvalidArgument("embedding table '", table_, "': the SparseTensor of ids has ", n,
                                " values but ", rows.dim_size(0), " row indices."));
    const int64_t count = nrows.scalar<int64_t>()();
    OP_REQUIRES_OK(ctx, ToTfStatus(ValidateRows(count, table_)));
    Tensor* splits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({count + 1}), &splits));
    OP_REQUIRES_OK(ctx, ToTfStatus(SplitsFromRows(rows.flat<int64_t>().data(), n, count, table_,
                                                  splits->flat<int64_t>().data())));
  }

 private:
  bool from_rows_ = true;
  std::string table_;
};

REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("BagSplits")).Device(::tensorflow::DEVICE_CPU),
                        BagSplitsCpuOp);

}  // namespace bag_splits
}  // namespace hybridtf
