// Converts the TF-free ImplStatus into a TensorFlow Status.
#ifndef HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
#define HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_

#include "kernels/common/status.h"
#include "tensorflow/core/framework/op_kernel.h"

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

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
