// CPU kernel of HybridTF>PackIds over the TF-free pack_ids layer.
#include "kernels/pack_ids/pack_ids_kernels.h"

#include "kernels/common/op_prefix.h"

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
    int64_t* out = packed->flat<int64_t>().data();
    for (int f = 0; f < ids.size(); ++f) {
      const Tensor& t = ids[f];
      const int64_t n = t.NumElements();
      sizes->flat<int64_t>()(f) = n;
      if (count_invalid_) {
        invalid->flat<int64_t>()(f) =
            t.dtype() == ::tensorflow::DT_INT32
                ? PackFieldCounting(t.flat<int32_t>().data(), n, row_offsets_[f], num_rows_[f], out)
                : PackFieldCounting(t.flat<int64_t>().data(), n, row_offsets_[f], num_rows_[f],
                                    out);
        out += n;
        continue;
      }
      invalid->flat<int64_t>()(f) = 0;
      ImplStatus status = t.dtype() == ::tensorflow::DT_INT32
                              ? PackField(t.flat<int32_t>().data(), n, row_offsets_[f],
                                          num_rows_[f], table_names_[f], out)
                              : PackField(t.flat<int64_t>().data(), n, row_offsets_[f],
                                          num_rows_[f], table_names_[f], out);
      OP_REQUIRES_OK(ctx, ToTfStatus(status));
      out += n;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name(HYBRIDTF_OP("PackIds")).Device(::tensorflow::DEVICE_CPU),
                        PackIdsCpuOp);

}  // namespace pack_ids
}  // namespace hybridtf
