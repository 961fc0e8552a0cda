// Resource variables of a fused in-place update: looked up, locked in address
// order, checked (initialized, float32) and made exclusively owned (a buffer
// someone else still references is copied first).
#ifndef HYBRIDTF_KERNELS_COMMON_TF_LOCKED_VARS_H_
#define HYBRIDTF_KERNELS_COMMON_TF_LOCKED_VARS_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace hybridtf {

class TfLockedVars {
 public:
  // Inputs [0, n) of the kernel are the variables' handles; `names` (n
  // entries, optional) name them in the aliasing error.
  TfLockedVars(::tensorflow::OpKernelContext* ctx, int n, const char* const* names = nullptr) {
    namespace errors = ::tensorflow::errors;
    for (int i = 0; i < n; ++i) {
      ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
      status_ = ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, i), &var);
      if (!status_.ok()) return;
      vars_.push_back(std::move(var));
    }
    for (size_t i = 0; i < vars_.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (vars_[i].get() == vars_[j].get()) {  // locking it twice would deadlock
          status_ = errors::InvalidArgument(
              "the fused update got the same variable as its input ", j, " (",
              names ? names[j] : "variable", ") and input ", i, " (", names ? names[i] : "variable",
              "); the table and each optimizer slot must be distinct variables.");
          return;
        }
      }
    }
    // Locked in address order, as TensorFlow's own updates lock theirs: two updates of the same
    // variables passed in another order (or one of TensorFlow's) cannot wait on each other.
    order_.reserve(vars_.size());
    for (auto& var : vars_) order_.push_back(var->mu());
    std::sort(order_.begin(), order_.end(), std::less<::tensorflow::mutex*>());
    for (auto* mu : order_) mu->lock();
    locked_ = true;
    for (auto& var : vars_) {
      ::tensorflow::Tensor* t = var->tensor();
      if (!t->IsInitialized()) {
        status_ = errors::FailedPrecondition("a variable of the fused update is not initialized.");
        return;
      }
      if (t->dtype() != ::tensorflow::DT_FLOAT) {
        status_ = errors::InvalidArgument("fused updates take float32 variables, got ",
                                          ::tensorflow::DataTypeString(t->dtype()), ".");
        return;
      }
      if (!t->RefCountIsOne()) {
        ::tensorflow::Tensor copy;
        status_ = ctx->allocate_temp(t->dtype(), t->shape(), &copy);
        if (!status_.ok()) return;
        std::memcpy(copy.data(), t->data(), t->TotalBytes());
        *t = copy;
      }
    }
  }
  ~TfLockedVars() {
    if (locked_) {
      for (auto it = order_.rbegin(); it != order_.rend(); ++it) (*it)->unlock();
    }
  }
  TfLockedVars(const TfLockedVars&) = delete;
  TfLockedVars& operator=(const TfLockedVars&) = delete;

  const ::tensorflow::Status& status() const { return status_; }
  float* data(int i) { return vars_[i]->tensor()->flat<float>().data(); }
  const ::tensorflow::TensorShape& shape(int i) { return vars_[i]->tensor()->shape(); }

 private:
  std::vector<::tensorflow::core::RefCountPtr<::tensorflow::Var>> vars_;
  std::vector<::tensorflow::mutex*> order_;
  ::tensorflow::Status status_;
  bool locked_ = false;
};

}  // namespace hybridtf

#endif  // HYBRIDTF_KERNELS_COMMON_TF_LOCKED_VARS_H_
