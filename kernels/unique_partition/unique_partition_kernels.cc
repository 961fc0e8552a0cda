// CPU kernel of HybridTF>UniquePartition: a thin OpKernel over the TF-free
// UniquePartitionCpu implementation layer.
#include "kernels/unique_partition/unique_partition_kernels.h"

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"

namespace hybridtf {
namespace unique_partition {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename Id, typename Idx>
class UniquePartitionCpuOp : public UniquePartitionOpBase {
 public:
  explicit UniquePartitionCpuOp(OpKernelConstruction* ctx) : UniquePartitionOpBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    PartitionSpec<Id> spec;
    OP_REQUIRES_OK(ctx, ParseInputs(ctx, &spec));
    const Tensor& ids = ctx->input(0);
    const int64_t n = ids.NumElements();

    UniquePartitionCpu<Id> impl;
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(impl.Prepare(ids.flat<Id>().data(), n, spec, CpuParallelFor(ctx))));

    Tensor* unique_ids = nullptr;
    Tensor* sizes = nullptr;
    Tensor* inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({impl.num_unique()}), &unique_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_partitions_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &inverse));
    impl.Finish(unique_ids->flat<Id>().data(), sizes->flat<int32_t>().data(),
                inverse->flat<Idx>().data());
  }
};

#define HYBRIDTF_REGISTER_CPU(Id, Idx)                          \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("UniquePartition"))  \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<Id>("T")          \
                              .TypeConstraint<Idx>("out_idx"),  \
                          UniquePartitionCpuOp<Id, Idx>);

HYBRIDTF_REGISTER_CPU(int32_t, int32_t)
HYBRIDTF_REGISTER_CPU(int32_t, int64_t)
HYBRIDTF_REGISTER_CPU(int64_t, int32_t)
HYBRIDTF_REGISTER_CPU(int64_t, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace unique_partition
}  // namespace hybridtf
