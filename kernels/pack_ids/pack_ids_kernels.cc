// CPU kernel of HybridTF>PackIds over the TF-free pack_ids layer.
#include "kernels/pack_ids/pack_ids_kernels.h"

#include <algorithm>
#include <vector>

#include "kernels/common/op_prefix.h"
#include "kernels/common/tf_parallel_for.h"

namespace hybridtf {
namespace pack_ids {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

class PackIdsCpuOp : public PackIdsOpBase {
 public:
  explicit PackIdsCpuOp(OpKernelConstruction* ctx) : PackIdsOpBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList ids;
    OP_REQUIRES_OK(ctx, ctx->input_list("ids", &ids));
    int64_t total = 0;
    for (int f = 0; f < ids.size(); ++f) total += ids[f].NumElements();
    Tensor* packed = nullptr;
    Tensor* sizes = nullptr;
    Tensor* invalid = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &packed));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({ids.size()}), &sizes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({ids.size()}), &invalid));
    // Every field is packed independently into its own slice, fields in
    // parallel; on invalid ids the error of the first bad field (in input
    // order) is reported, as a sequential pass would.
    std::vector<int64_t> starts(ids.size() + 1, 0);
    for (int f = 0; f < ids.size(); ++f) starts[f + 1] = starts[f] + ids[f].NumElements();
    int64_t* out = packed->flat<int64_t>().data();
    auto* sizes_out = sizes->flat<int64_t>().data();
    auto* invalid_out = invalid->flat<int64_t>().data();
    std::vector<ImplStatus> status(ids.size(), ImplStatus::Ok());
    const int64_t per_field = ids.size() ? std::max<int64_t>(1, total / ids.size()) : 1;
    CpuParallelFor(ctx)(ids.size(), 2 * per_field, [&](int64_t first, int64_t last) {
      for (int64_t f = first; f < last; ++f) {
        const Tensor& t = ids[f];
        const int64_t n = t.NumElements();
        int64_t* dst = out + starts[f];
        sizes_out[f] = n;
        const bool narrow = t.dtype() == ::tensorflow::DT_INT32;
        if (count_invalid_) {
          invalid_out[f] = narrow ? PackFieldCounting(t.flat<int32_t>().data(), n, row_offsets_[f],
                                                      num_rows_[f], dst)
                                  : PackFieldCounting(t.flat<int64_t>().data(), n, row_offsets_[f],
                                                      num_rows_[f], dst);
          continue;
        }
        invalid_out[f] = 0;
        status[f] = narrow ? PackField(t.flat<int32_t>().data(), n, row_offsets_[f], num_rows_[f],
                                       table_names_[f], dst)
                           : PackField(t.flat<int64_t>().data(), n, row_offsets_[f], num_rows_[f],
                                       table_names_[f], dst);
      }
    });
    for (const ImplStatus& s : status) OP_REQUIRES_OK(ctx, ToTfStatus(s));
  }
};

REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("PackIds")).Device(::tensorflow::DEVICE_CPU),
                        PackIdsCpuOp);

}  // namespace pack_ids
}  // namespace hybridtf
