// Compiles the kernel body named by RADIXLM_BODY once per instruction set, each in its own namespace with
// its vector layer (see cpu_isa.h). No include guard: a kernel .cpp includes it once, after defining
// RADIXLM_BODY and the types its body shares across paths.
#ifndef RADIXLM_BODY
#error "define RADIXLM_BODY (the kernel body header) before including cpu_foreach_isa.h"
#endif

namespace radixlm_portable {
#include "cpu_vec_portable.h"
#include RADIXLM_BODY
}  // namespace radixlm_portable

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace radixlm_avx2 {
#include "cpu_vec_avx2.h"
#include RADIXLM_BODY
}  // namespace radixlm_avx2
#pragma GCC pop_options

#ifdef RADIXLM_WITH_VNNI  // the AVX2 + VNNI path, in its VEX and EVEX encodings (cpu_isa.h)
#if RADIXLM_HAS_AVXVNNI
#define RADIXLM_AVX2_VNNI_CALL(fn, ...) \
  (::radixlm_cpu::has_avx_vnni() ? radixlm_avxvnni::fn(__VA_ARGS__) : radixlm_avxvnni_evex::fn(__VA_ARGS__))
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace radixlm_avxvnni {
#define RADIXLM_DPBUSD256 _mm256_dpbusd_avx_epi32
#define RADIXLM_DPWSSD256 _mm256_dpwssd_avx_epi32
#include "cpu_vec_avx2.h"
#include RADIXLM_BODY
#undef RADIXLM_DPBUSD256
#undef RADIXLM_DPWSSD256
}  // namespace radixlm_avxvnni
#pragma GCC pop_options
#else
#define RADIXLM_AVX2_VNNI_CALL(fn, ...) radixlm_avxvnni_evex::fn(__VA_ARGS__)
#endif

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
namespace radixlm_avxvnni_evex {
#define RADIXLM_DPBUSD256 _mm256_dpbusd_epi32
#define RADIXLM_DPWSSD256 _mm256_dpwssd_epi32
#include "cpu_vec_avx2.h"
#include RADIXLM_BODY
#undef RADIXLM_DPBUSD256
#undef RADIXLM_DPWSSD256
}  // namespace radixlm_avxvnni_evex
#pragma GCC pop_options
#else
#define RADIXLM_AVX2_VNNI_CALL(fn, ...) radixlm_avx2::fn(__VA_ARGS__)
#endif

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
namespace radixlm_avx512 {
#include "cpu_vec_avx512.h"
#include RADIXLM_BODY
}  // namespace radixlm_avx512
#pragma GCC pop_options
#endif

#if defined(__aarch64__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace radixlm_neon {
#include "cpu_vec_neon.h"
#include RADIXLM_BODY
}  // namespace radixlm_neon
#pragma GCC pop_options
#endif

#undef RADIXLM_BODY
