// Converts the TF-free ImplStatus into a TensorFlow Status (InvalidArgument).
#ifndef HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
#define HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_

#include "kernels/common/status.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hybridtf {

inline ::tensorflow::Status ToTfStatus(const ImplStatus& status) {
  if (status.ok()) return ::tensorflow::Status();
  return ::tensorflow::errors::InvalidArgument(status.message());
}

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_TF_STATUS_H_
