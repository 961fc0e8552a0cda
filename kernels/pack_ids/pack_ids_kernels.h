// Attribute parsing of the PackIds kernel (shared by future device kernels).
#ifndef HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_KERNELS_H_
#define HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_KERNELS_H_

#include <string>
#include <vector>

#include "kernels/common/tf_status.h"
#include "kernels/pack_ids/pack_ids_impl.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {
namespace pack_ids {

class PackIdsOpBase : public ::tensorflow::OpKernel {
 public:
  explicit PackIdsOpBase(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_offsets", &row_offsets_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_rows", &num_rows_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_names", &table_names_));
    std::string on_invalid;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("on_invalid", &on_invalid));
    count_invalid_ = on_invalid == "count";
    const size_t n = static_cast<size_t>(ctx->num_inputs());
    OP_REQUIRES(ctx, row_offsets_.size() == n && num_rows_.size() == n && table_names_.size() == n,
                ::tensorflow::errors::InvalidArgument(
                    "PackIds has ", n, " id inputs but ", row_offsets_.size(), " row_offsets, ",
                    num_rows_.size(), " num_rows and ", table_names_.size(),
                    " table_names; give one of each per input."));
    for (size_t f = 0; f < n; ++f) {
      OP_REQUIRES_OK(ctx,
                     ToTfStatus(ValidateTable(row_offsets_[f], num_rows_[f], table_names_[f])));
    }
  }

 protected:
  std::vector<::tensorflow::int64> row_offsets_;
  std::vector<::tensorflow::int64> num_rows_;
  std::vector<std::string> table_names_;
  bool count_invalid_ = false;
};

}  // namespace pack_ids
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_PACK_IDS_PACK_IDS_KERNELS_H_
