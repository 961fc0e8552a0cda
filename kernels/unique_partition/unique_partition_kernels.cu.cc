// GPU kernel of HybridTF>UniquePartition: a thin OpKernel over the TF-free
// UniquePartitionGpu layer (unique_partition_impl.cu). Built only when CUDA is
// (GOOGLE_CUDA); a CPU-only build leaves this file out.
#if GOOGLE_CUDA

#include "kernels/unique_partition/unique_partition_kernels.h"

#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/unique_partition/unique_partition_impl_cuda.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/stream_executor.h"

namespace hybridtf {
namespace unique_partition {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// Scratch from TensorFlow's GPU allocator; the tensors are held until the
// kernel returns (the allocator is stream-ordered, so reuse is safe after).
class TfDeviceScratch : public DeviceScratch {
 public:
  explicit TfDeviceScratch(OpKernelContext* ctx) : ctx_(ctx) {}
  void* Allocate(size_t bytes) override {
    Tensor t;
    const auto size = static_cast<int64_t>(bytes);
    if (!ctx_->allocate_temp(::tensorflow::DT_INT8, TensorShape({size}), &t).ok()) {
      return nullptr;
    }
    held_.push_back(t);
    return t.flat<int8_t>().data();
  }

 private:
  OpKernelContext* ctx_;
  std::vector<Tensor> held_;
};

template <typename Id, typename Idx>
class UniquePartitionGpuOp : public UniquePartitionOpBase {
 public:
  explicit UniquePartitionGpuOp(OpKernelConstruction* ctx) : UniquePartitionOpBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    PartitionSpec<Id> spec;
    OP_REQUIRES_OK(ctx, ParseInputs(ctx, &spec));  // range_bounds is in host memory
    const Tensor& ids = ctx->input(0);
    const int64_t n = ids.NumElements();
    void* stream = ctx->op_device_context()->stream()->platform_specific_handle().stream;

    TfDeviceScratch scratch(ctx);
    UniquePartitionGpu<Id> impl;
    OP_REQUIRES_OK(ctx, ToTfStatus(impl.Prepare(ids.flat<Id>().data(), n, spec, &scratch, stream)));
    Tensor* unique_ids = nullptr;
    Tensor* sizes = nullptr;
    Tensor* inverse = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({impl.num_unique()}), &unique_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_partitions_}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &inverse));
    OP_REQUIRES_OK(
        ctx, ToTfStatus(impl.Finish(unique_ids->flat<Id>().data(), sizes->flat<int32_t>().data(),
                                    inverse->flat<Idx>().data(), stream)));
  }
};

#define HYBRIDTF_REGISTER_GPU(Id, Idx)                          \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("UniquePartition"))  \
                              .Device(::tensorflow::DEVICE_GPU) \
                              .HostMemory("range_bounds")       \
                              .HostMemory("partition_sizes")    \
                              .TypeConstraint<Id>("T")          \
                              .TypeConstraint<Idx>("out_idx"),  \
                          UniquePartitionGpuOp<Id, Idx>);

HYBRIDTF_REGISTER_GPU(int32_t, int32_t)
HYBRIDTF_REGISTER_GPU(int32_t, int64_t)
HYBRIDTF_REGISTER_GPU(int64_t, int32_t)
HYBRIDTF_REGISTER_GPU(int64_t, int64_t)
#undef HYBRIDTF_REGISTER_GPU

}  // namespace unique_partition
}  // namespace hybridtf

#endif  // GOOGLE_CUDA
