// CPU kernel of HybridTF>UniqueSubset: a thin OpKernel over the TF-free
// UniqueSubsetCpu implementation layer. There is no GPU kernel.
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/unique_partition/unique_subset_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace unique_subset {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

template <typename Id, typename Idx>
class UniqueSubsetCpuOp : public OpKernel {
 public:
  explicit UniqueSubsetCpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source_fields", &map_.source_fields));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("source_offsets", &map_.source_offsets));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("target_offsets", &map_.target_offsets));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_rows", &map_.num_rows));
    OP_REQUIRES_OK(ctx, ToTfStatus(ValidateFieldMap<Id>(map_)));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& unique_ids = ctx->input(0);
    const Tensor& inverse = ctx->input(1);
    const Tensor& field_sizes = ctx->input(2);
    for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&unique_ids, "unique_ids"},
                                  {&inverse, "inverse"},
                                  {&field_sizes, "field_sizes"}}) {
      OP_REQUIRES(ctx, t->dims() == 1,
                  errors::InvalidArgument(
                      "UniqueSubset: ", name, " must be a vector (rank 1), got shape ",
                      t->shape().DebugString(),
                      ". Pass A's unique_partition outputs and field sizes as they are."));
    }
    SourceResult<Id, Idx> source;
    source.unique_ids = unique_ids.flat<Id>().data();
    source.num_unique = unique_ids.NumElements();
    source.inverse = inverse.flat<Idx>().data();
    source.num_positions = inverse.NumElements();
    source.field_sizes = field_sizes.flat<int64_t>().data();
    source.num_fields = field_sizes.NumElements();

    UniqueSubsetCpu<Id, Idx> impl;
    OP_REQUIRES_OK(ctx, ToTfStatus(impl.Prepare(source, map_, CpuParallelFor(ctx))));
    Tensor* unique_out = nullptr;
    Tensor* sizes_out = nullptr;
    Tensor* inverse_out = nullptr;
    Tensor* fields_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({impl.num_unique()}), &unique_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({1}), &sizes_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({impl.num_positions()}), &inverse_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({impl.num_fields()}), &fields_out));
    impl.Finish(unique_out->flat<Id>().data(), sizes_out->flat<int32_t>().data(),
                inverse_out->flat<Idx>().data(), fields_out->flat<int64_t>().data());
  }

 private:
  FieldMap map_;
};

#define HYBRIDTF_REGISTER_CPU(Id, Idx)                          \
  REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("UniqueSubset"))     \
                              .Device(::tensorflow::DEVICE_CPU) \
                              .TypeConstraint<Id>("Id")         \
                              .TypeConstraint<Idx>("Idx"),      \
                          UniqueSubsetCpuOp<Id, Idx>);

HYBRIDTF_REGISTER_CPU(int32_t, int32_t)
HYBRIDTF_REGISTER_CPU(int32_t, int64_t)
HYBRIDTF_REGISTER_CPU(int64_t, int32_t)
HYBRIDTF_REGISTER_CPU(int64_t, int64_t)
#undef HYBRIDTF_REGISTER_CPU

}  // namespace unique_subset
}  // namespace hybridtf
