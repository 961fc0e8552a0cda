// Device-independent part of the HybridTF>UniquePartition kernels: attribute
// parsing and input validation. The CPU kernel (unique_partition_kernels.cc)
// and the GPU kernel (unique_partition_kernels.cu.cc) derive from this base
// and only differ in which implementation layer they call.
#ifndef HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_KERNELS_H_
#define HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_KERNELS_H_

#include <string>

#include "kernels/common/tf_status.h"
#include "kernels/unique_partition/unique_partition_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace unique_partition {

class UniquePartitionOpBase : public ::tensorflow::OpKernel {
 public:
  explicit UniquePartitionOpBase(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_partitions", &num_partitions_));
    OP_REQUIRES(ctx, num_partitions_ >= 1 && num_partitions_ <= kMaxPartitions,
                ::tensorflow::errors::InvalidArgument(
                    "num_partitions must be in [1, ", kMaxPartitions, "], got ", num_partitions_,
                    ". Use the number of ranks that own embedding shards."));
    std::string name;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("strategy", &name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sorted", &sorted_));
    OP_REQUIRES(ctx, ParseStrategy(name, &strategy_),
                ::tensorflow::errors::InvalidArgument("strategy must be 'mod' or 'range', got '",
                                                      name, "'."));
  }

 protected:
  // Validates the inputs (ranks, bounds, length) and fills `spec`, whose
  // bounds point into the host-memory range_bounds tensor.
  template <typename Id>
  ::tensorflow::Status ParseInputs(::tensorflow::OpKernelContext* ctx,
                                   PartitionSpec<Id>* spec) const {
    const ::tensorflow::Tensor& ids = ctx->input(0);
    const ::tensorflow::Tensor& bounds = ctx->input(1);
    if (ids.dims() != 1) {
      return ::tensorflow::errors::InvalidArgument(
          "ids must be a vector (rank 1), got shape ", ids.shape().DebugString(),
          ". Flatten packed ids first, e.g. tf.reshape(ids, [-1]).");
    }
    if (bounds.dims() != 1) {
      return ::tensorflow::errors::InvalidArgument(
          "range_bounds must be a vector (rank 1), got shape ", bounds.shape().DebugString(), ".");
    }
    spec->num_partitions = static_cast<int32_t>(num_partitions_);
    spec->strategy = strategy_;
    spec->sorted = sorted_;
    spec->num_bounds = bounds.NumElements();
    spec->bounds = spec->num_bounds > 0 ? bounds.flat<Id>().data() : nullptr;
    TF_RETURN_IF_ERROR(ToTfStatus(ValidateSpec(*spec)));
    return ToTfStatus(ValidateLength(ids.NumElements()));
  }

  ::tensorflow::int64 num_partitions_ = 1;
  Strategy strategy_ = Strategy::kModulo;
  bool sorted_ = false;
};

}  // namespace unique_partition
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_UNIQUE_PARTITION_UNIQUE_PARTITION_KERNELS_H_
