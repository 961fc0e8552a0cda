// Converts the TF-free ImplStatus into a TensorFlow Status.
#ifndef HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
#define HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_

#include <string>

#include "kernels/common/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace hybridtf {

inline ::tensorflow::Status ToTfStatus(const ImplStatus& status) {
  switch (status.code()) {
    case ImplStatus::Code::kOk:
      return ::tensorflow::Status();
    case ImplStatus::Code::kInvalidArgument:
      return ::tensorflow::errors::InvalidArgument(status.message());
    case ImplStatus::Code::kInternal:
      break;
  }
  return ::tensorflow::errors::Internal(status.message());
}

// The shape [rows, cols] of output `what`, or InvalidArgument naming it when a
// dimension is negative or the element count overflows (TensorShape's
// constructor would CHECK-fail and abort the process instead).
inline ::tensorflow::Status MatrixShape(int64_t rows, int64_t cols, const std::string& what,
                                        ::tensorflow::TensorShape* shape) {
  const ::tensorflow::Status s = ::tensorflow::TensorShape::BuildTensorShape({rows, cols}, shape);
  if (s.ok()) return s;
  return ::tensorflow::errors::InvalidArgument(what, " would have shape [", rows, ", ", cols,
                                               "], which is not a valid tensor shape (",
                                               s.message(), "); check the sizes that give it.");
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
