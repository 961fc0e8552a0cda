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
  enum class Code { kOk, kInvalidArgument, kInternal };

  ImplStatus() = default;
  static ImplStatus Ok() { return ImplStatus(); }
  // Bad input: the message says what is wrong and how to fix it.
  static ImplStatus InvalidArgument(std::string message) {
    return ImplStatus(Code::kInvalidArgument, std::move(message));
  }
  // A failure that is not the caller's input (e.g. a CUDA runtime error).
  static ImplStatus Internal(std::string message) {
    return ImplStatus(Code::kInternal, std::move(message));
  }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ImplStatus(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_STATUS_H_
