// Function multiversioning for the hot loops of the *_impl layers.
//
// HYBRIDTF_MULTIVERSION before a function compiles it twice, for AVX2 and for
// the portable baseline, and lets the loader pick the version the CPU runs
// (GCC's target_clones on x86-64; elsewhere it expands to nothing). AVX2 here
// means wider vectors only: FMA stays off, so every float operation rounds as
// in the baseline build and results are bit-identical on every CPU.
#ifndef HYBRIDTF_KERNELS_COMMON_MULTIVERSION_H_
#define HYBRIDTF_KERNELS_COMMON_MULTIVERSION_H_

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define HYBRIDTF_MULTIVERSION __attribute__((target_clones("avx2", "default")))
// Integer bit counting: the POPCNT instruction where the CPU has it (the
// baseline build calls libgcc's software popcount for __builtin_popcountll).
#define HYBRIDTF_MULTIVERSION_POPCNT __attribute__((target_clones("popcnt", "default")))
#else
#define HYBRIDTF_MULTIVERSION
#define HYBRIDTF_MULTIVERSION_POPCNT
#endif

#endif  // HYBRIDTF_KERNELS_COMMON_MULTIVERSION_H_
