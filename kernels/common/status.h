// A TensorFlow-free status type shared by every *_impl layer.
//
// The implementation layers (CPU and CUDA algorithms) must build without
// TensorFlow so that they can be bound to NumPy with pybind11 and tested on a
// GPU machine with nvcc alone. They report bad input through this type; the
// thin OpKernel wrappers turn it into errors::InvalidArgument and the pybind11
// module into a Python ValueError, so both paths show the same message.
#ifndef HYBRIDTF_KERNELS_COMMON_STATUS_H_
#define HYBRIDTF_KERNELS_COMMON_STATUS_H_

#include <string>
#include <utility>

namespace hybridtf {

class ImplStatus {
 public:
  ImplStatus() = default;
  static ImplStatus Ok() { return ImplStatus(); }
  static ImplStatus InvalidArgument(std::string message) {
    return ImplStatus(std::move(message));
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  explicit ImplStatus(std::string message)
      : ok_(false), message_(std::move(message)) {}
  bool ok_ = true;
  std::string message_;
};

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_STATUS_H_
