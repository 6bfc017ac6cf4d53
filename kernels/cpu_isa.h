// radixlm's C++ CPU kernels: one build serves every CPU. Each kernel's body (cpu_*_body.h) is written once
// against a small vector layer and compiled once per instruction set, inside its own namespace and
// `#pragma GCC target` region (cpu_foreach_isa.h): portable C++, AVX2 + FMA + F16C, and AVX512 (F, DQ,
// BW, VL, VNNI) on x86-64; portable C++ and NEON with dotprod on AArch64. Every op takes the path to run
// as its last argument (kernels/cpu_ext.py passes the fastest the CPU has; tests pass each in turn); a path
// the CPU lacks is an error, never an illegal instruction. All paths give bit-identical results (see
// cpu_vec_portable.h), except the AVX512-BF16 attention (bfloat16 dot products in hardware).
//
// The AVX2 + VNNI path is the AVX2 layer with vpdpbusd for the matmuls' int8 dot products (the other
// kernels run their AVX2 code on it). vpdpbusd on 256-bit registers has two encodings: VEX (AVX-VNNI:
// Intel Alder Lake and later client CPUs, which lack AVX512) and EVEX (AVX512-VNNI with VL). The matmul
// body is compiled for each, from the same source, and the path runs whichever the CPU has, VEX first.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_types.h"

// Compilers that know the avxvnni target (GCC 11, clang 12); with older ones the AVX2 + VNNI path is built in
// its EVEX encoding only, so it runs on AVX512-VNNI CPUs only.
#ifndef RADIXLM_HAS_AVXVNNI  // (a build may set it to 0)
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define RADIXLM_HAS_AVXVNNI 1
#else
#define RADIXLM_HAS_AVXVNNI 0
#endif
#endif

namespace radixlm_cpu {

// Whether the CPU runs vpdpbusd's VEX encoding (AVX-VNNI) and this build has it.
inline bool has_avx_vnni() {
#if RADIXLM_HAS_AVXVNNI
  return __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

enum Isa : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kNeon = 4, kAvx2Vnni = 5 };

inline bool isa_supported(int64_t isa) {
#if defined(__x86_64__)
  switch (isa) {
    case kPortable: return true;
    case kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
    case kAvx512Bf16: return isa_supported(kAvx512) && __builtin_cpu_supports("avx512bf16");
    case kAvx2Vnni:
      return isa_supported(kAvx2) && (has_avx_vnni() ||
                                      (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")));
    default: return false;
  }
#elif defined(__aarch64__)
  return isa == kPortable || (isa == kNeon && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0);
#else
  return isa == kPortable;
#endif
}

inline void check_isa(int64_t isa) {
  TORCH_CHECK(isa_supported(isa), "kernel path ", isa, " (0 portable, 1 avx2, 2 avx512, 3 avx512-bf16, 4 neon, "
              "5 avx2-vnni) is not supported by this CPU");
}

// Calls f with a null pointer of x's element type: float for float32 tensors, else bfloat16.
template <typename F>
void dispatch_float_bf16(const at::Tensor& x, const F& f) {
  if (x.scalar_type() == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<at::BFloat16*>(nullptr));
  }
}

}  // namespace radixlm_cpu

// RADIXLM_ISA_CALL(isa, fn<T>, args...): fn from the namespace of path isa (AVX512-BF16 runs the AVX512 one;
// AVX2 + VNNI its own where the translation unit defines RADIXLM_WITH_VNNI, else AVX2's: cpu_foreach_isa.h).
#if defined(__x86_64__)
#define RADIXLM_ISA_CALL(isa, fn, ...)                                         \
  ((isa) == ::radixlm_cpu::kAvx512 || (isa) == ::radixlm_cpu::kAvx512Bf16      \
       ? radixlm_avx512::fn(__VA_ARGS__)                                      \
   : (isa) == ::radixlm_cpu::kAvx2Vnni ? RADIXLM_AVX2_VNNI_CALL(fn, __VA_ARGS__) \
   : (isa) == ::radixlm_cpu::kAvx2     ? radixlm_avx2::fn(__VA_ARGS__)         \
                                       : radixlm_portable::fn(__VA_ARGS__))
#elif defined(__aarch64__)
#define RADIXLM_ISA_CALL(isa, fn, ...) \
  ((isa) == ::radixlm_cpu::kNeon ? radixlm_neon::fn(__VA_ARGS__) : radixlm_portable::fn(__VA_ARGS__))
#else
#define RADIXLM_ISA_CALL(isa, fn, ...) radixlm_portable::fn(__VA_ARGS__)
#endif
