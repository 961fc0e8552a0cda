// Device-independent part of the StitchCombine kernels: attribute parsing,
// input validation and the Layout that both the forward and the gradient use.
#ifndef HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_KERNELS_H_
#define HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_KERNELS_H_

#include <string>
#include <vector>

#include "kernels/common/tf_parallel_for.h"
#include "kernels/common/tf_status.h"
#include "kernels/stitch_combine/stitch_combine_impl.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace hybridtf {
namespace stitch_combine {

class StitchCombineOpBase : public ::tensorflow::OpKernel {
 public:
  explicit StitchCombineOpBase(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_fields", &num_fields_));
    std::vector<std::string> names;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &names));
    OP_REQUIRES(ctx, static_cast<int64_t>(names.size()) == num_fields_,
                ::tensorflow::errors::InvalidArgument("combiners has ", names.size(),
                                                      " entries but num_fields is ", num_fields_,
                                                      "; give one per field."));
    for (const std::string& name : names) {
      Combiner combiner;
      OP_REQUIRES(ctx, ParseCombiner(name, &combiner),
                  ::tensorflow::errors::InvalidArgument(
                      "combiner must be one of 'none', 'sum', 'mean', 'sqrtn', got '", name, "'."));
      combiners_.push_back(combiner);
    }
  }

 protected:
  // Validates the layout inputs starting at input `first` (inverse,
  // field_sizes, field_segments, segment_lengths, weights) and builds layout.
  template <typename T>
  ::tensorflow::Status BuildLayout(::tensorflow::OpKernelContext* ctx, int first,
                                   Layout* layout) const {
    const ::tensorflow::Tensor& inverse = ctx->input(first);
    const ::tensorflow::Tensor& sizes = ctx->input(first + 1);
    const ::tensorflow::Tensor& segments = ctx->input(first + 2);
    const ::tensorflow::Tensor& lengths = ctx->input(first + 3);
    const ::tensorflow::Tensor& weights = ctx->input(first + 4);
    const char* names[] = {"inverse", "field_sizes", "field_segments", "segment_lengths",
                           "weights"};
    for (int i = 0; i < 5; ++i) {
      if (ctx->input(first + i).dims() != 1) {
        return ::tensorflow::errors::InvalidArgument(names[i], " must be a vector, got shape ",
                                                     ctx->input(first + i).shape().DebugString(),
                                                     ".");
      }
    }
    if (sizes.NumElements() != num_fields_ || segments.NumElements() != num_fields_) {
      return ::tensorflow::errors::InvalidArgument(
          "field_sizes and field_segments need num_fields = ", num_fields_, " entries, got ",
          sizes.NumElements(), " and ", segments.NumElements(), ".");
    }
    const int64_t n = inverse.NumElements();
    if (weights.NumElements() != 0 && weights.NumElements() != n) {
      return ::tensorflow::errors::InvalidArgument(
          "weights must be empty or have one entry per id (", n, "), got ", weights.NumElements(),
          ".");
    }
    return ToTfStatus(layout->Build(combiners_, sizes.flat<int64_t>().data(),
                                    segments.flat<int64_t>().data(), lengths.flat<int64_t>().data(),
                                    lengths.NumElements(), n));
  }

  ::tensorflow::int64 num_fields_ = 1;
  std::vector<Combiner> combiners_;
};

}  // namespace stitch_combine
}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_STITCH_COMBINE_STITCH_COMBINE_KERNELS_H_
