// The one place that defines the namespace of hybridtf's op names.
//
// Every REGISTER_OP / REGISTER_KERNEL_BUILDER uses HYBRIDTF_OP("Name"), which
// expands to the string literal "HybridTF>Name", so no op can clash with a
// TensorFlow op or another plugin's op.
#ifndef HYBRIDTF_KERNELS_COMMON_OP_PREFIX_H_
#define HYBRIDTF_KERNELS_COMMON_OP_PREFIX_H_

#define HYBRIDTF_OP(name) "HybridTF>" name

#endif  // HYBRIDTF_KERNELS_COMMON_OP_PREFIX_H_
