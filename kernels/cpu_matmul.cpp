// Weight-only int2 / int3 / int4 / int5 / int6 / int8 matmuls and the dense matmul: x [M, K] (float32 or bfloat16)
// times W [N, K]^T -> y [M, N] in x's dtype. Torch references: cpu_matmul.py. The bodies are in cpu_matmul_body.h,
// compiled once per instruction set; these are the ops, their checks and the threading.
//
// Quantized weights: the activations are quantized on the fly to int8, one scale per group of 32 along K
// (a = max|x| / 127, as llama.cpp's Q8_0 / Q8_1 activations), so the inner product is an int8 dot product
// (AVX512-VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, or the AVX2 + VNNI path's 256-bit vpdpbusd) instead
// of float FMAs.
//
// Weights are tiled 16 output rows at a time, so a vector lane is an output row, and the float scales
// apply to 16 rows at once (no horizontal sums). N must be a multiple of 16.
// int4: q in [0, 15], w = d * q + mn per group of 32 along K (GGUF's Q4_1; Q4_0 without mn: mn = -8 d).
//   codes [N/16, K/4, 32] bytes: for a tile and a k-quad, byte p holds row p/4's k % 4 = p % 4 in its low
//   nibble and row 8 + p/4's in its high nibble; d, mn float16 [N/16, K/32, 16] (mn may be empty).
//   sum_k w x = sum_g d_g a sum(q xq) + mn_g a sum(xq).
// int5: the int4 codes' nibbles [N/16, K/4, 40]: per k-quad int4's 32 bytes, then 8 bytes of fifth bits (bit l of
//   lane l in int4's byte order: rows 0-7 then 8-15), w = d * q + mn, q in [0, 31] (GGUF's Q5_0, Q5_1, Q5_K);
//   mn is always stored.
// K-quant layout of int4 / int5 (GGUF's Q4_K / Q5_K): codes [N/16, K/32, 288 | 352], per group of 32 the 8 k-quads'
//   bytes as above, then the tile's 16 scales sc_g and 16 minimums m_g (6-bit, one byte each); d and mn float16
//   [N/16, K/256, 16] hold d and -dmin per super-block of 256: w = d sc_g q + (-dmin) m_g.
// int6: w = d * sc_j * (q - 32), q in [0, 63] (GGUF's Q6_K): codes uint8 [N/16, K/16, 208], per sub-block of 16
//   along K 4 k-quads of 48 bytes (int4's 32, then 16 bytes of high bits: lane l's two at bits 2 (l / 16) of byte
//   l % 16) and the 16 rows' int8 sub-block scales sc_j; d float16 [N/16, K/256, 16] per super-block of 256.
// int3: w = d * sc_j * (q - 4), q in [0, 7] (GGUF's Q3_K): int6's form with codes [N/16, K/16, 112], per sub-block 4
//   k-quads of 24 bytes (16 bytes of the low two bits, as int6's high bits, then 8 bytes of third bits, bit l of lane l
//   as int5's fifth bits) and the 16 rows' int8 sc_j; d float16 [N/16, K/256, 16].
// IQ4 layout of int4 (GGUF's IQ4_NL, IQ4_XS): w = d * kv[q], q in [0, 15], kv 16 int8 values: mn empty for IQ4_NL's,
//   else the int8 [16] table itself (cpu_matmul.py's GRID_VALUES for GGUF's IQ2_XXS and IQ1_S); codes [N/16, K/32,
//   256] (a group's 8 k-quads of int4's bytes), d float16 [N/16, K/32, 16]; IQ4_XS's: [N/16, K/32, 272], each
//   group's codes then the tile's 16 int8 scales sc, d [N/16, K/256, 16]: w = d sc kv[q].
// table form of int4 (GGUF's IQ2_XS, IQ2_S): w = d * sc_j * kv[q], kv 16 int8 values in [-64, 63] given as mn (int8
//   [16]), q in [0, 15], sc_j int8 per 16 along K: codes [N/16, K/16, 144], per sub-block 4 k-quads of int4's bytes,
//   then the 16 rows' sc_j; d float16 [N/16, K/256, 16].
// int2: w = d * sc_j * q - dmin * m_j, q in [0, 3] (GGUF's Q2_K): codes [N/16, K/16, 96], per sub-block 4 k-quads of
//   16 bytes (int3's low bit pairs), the 16 rows' sc_j, then their m_j (4-bit values, a byte each); d and mn (-dmin)
//   float16 [N/16, K/256, 16].
// int8: w = d * q per group of 32 along K (GGUF's Q8_0), q int8 in [-127, 127] [N/16, K/4, 64] (16 rows x 4 k),
//   d float16 [N/16, K/32, 16] (as int4's).
// dense: w [N/16, K, 16] in bfloat16 or float32, k-major inside a tile; x is widened to float32.
#include "cpu_isa.h"
#include "cpu_ops.h"

#define RADIXLM_WITH_VNNI
#define RADIXLM_BODY "cpu_matmul_body.h"
#include "cpu_foreach_isa.h"

namespace radixlm_cpu {
namespace {

void check_x(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(x.size(1) == k && k % 64 == 0, "x has ", x.size(1), " columns; the weight has ", k,
              " (a multiple of 64)");
}

// y = x W^T [M, N] in `dtype` (a dense weight's own dtype) from a checked weight; after(t0, t1, y) runs on each
// thread's tiles [t0, t1) as soon as they are done
template <typename After>
at::Tensor tiled_linear(const at::Tensor& x, const QuantWeightRef& w, int64_t isa, at::ScalarType dtype,
                        const After& after) {
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<char> memory(Activations::bytes(m, k, w.bits) + 64);
  const Activations a = Activations::at(memory.data(), m, k, w.bits);
  at::parallel_for(0, m, 16, [&](int64_t r0, int64_t r1) { prepare_range(x, {r0, r1, 0, k / 64}, a, w.bits, isa); });
  at::Tensor y = at::empty({m, w.n()}, x.options().dtype(dtype));
  at::parallel_for(0, w.n() / 16, 4, [&](int64_t t0, int64_t t1) {
    linear_tiles(w, a, t0, t1, y, 0, isa);
    after(t0, t1, y);
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const QuantWeightRef& w, int64_t isa) {
  check_isa(isa);
  check_weight(w);
  check_x(x, w.k());
  TORCH_CHECK(w.bits != 16 || w.data.scalar_type() == x.scalar_type(), "dense weight: x and w dtypes differ");
  return tiled_linear(x, w, isa, x.scalar_type(), [](int64_t, int64_t, const at::Tensor&) {});
}

}  // namespace

at::Tensor linear_logits(const at::Tensor& x, const QuantWeightRef& w, int64_t isa) {
  if (w.bits != 16) {  // the tiles' float32 sums stored as they are: rounding a logit to bfloat16 moves it by up to 2^-9 of
                       // itself, which costs more fidelity than any other rounding of the quantized path
    return tiled_linear(x, w, isa, at::kFloat, [](int64_t, int64_t, const at::Tensor&) {});
  }
  at::Tensor out = at::empty({x.size(0), w.n()}, x.options().dtype(at::kFloat));
  tiled_linear(x, w, isa, x.scalar_type(), [&](int64_t t0, int64_t t1, const at::Tensor& y) {  // while in cache
    dispatch_float_bf16(y, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      RADIXLM_ISA_CALL(isa, widen_rows<T>, y.data_ptr<T>(), 0, y.size(0), 16 * t0, 16 * t1, y.size(1),
                       out.data_ptr<float>());
    });
  });
  return out;
}

void check_kform(const QuantWeightRef& w) {
  TORCH_CHECK(w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 && w.scales.size(0) == w.data.size(0) &&
              w.scales.size(1) * 8 == w.data.size(1) && w.scales.size(2) == 16 && w.mins.defined() &&
              w.mins.sizes() == w.scales.sizes() && w.mins.scalar_type() == at::kHalf && w.data.is_contiguous() &&
              w.scales.is_contiguous() && w.mins.is_contiguous(),
              "int", w.bits, " weight, K-quant layout: uint8 codes [N / 16, K / 32, ", w.data.size(2),
              "] with float16 d and -dmin [N / 16, K / 256, 16]");
}

void check_weight(const QuantWeightRef& w) {
  if (w.table()) {
    TORCH_CHECK(w.data.scalar_type() == at::kByte && w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 &&
                w.scales.size(0) == w.data.size(0) && w.scales.size(1) * 16 == w.data.size(1) &&
                w.scales.size(2) == 16 && w.data.is_contiguous() && w.scales.is_contiguous() && w.mins.defined() &&
                w.mins.scalar_type() == at::kChar && w.mins.numel() == 16 && w.mins.is_contiguous() &&
                small_values(w.mins.data_ptr<int8_t>()),
                "int4 weight, table form: uint8 codes [N / 16, K / 16, 144] with float16 d [N / 16, K / 256, 16] and "
                "an int8 [16] table of the codes' values, each in [-64, 63]");
  } else if (w.kform()) {
    check_kform(w);
  } else if (w.iq4()) {
    const int64_t per = w.iq4_xs() ? 8 : 1;  // groups a scale
    TORCH_CHECK(w.data.scalar_type() == at::kByte && w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 &&
                w.scales.size(0) == w.data.size(0) && w.scales.size(1) * per == w.data.size(1) &&
                w.scales.size(2) == 16 && w.data.is_contiguous() && w.scales.is_contiguous() &&
                (!w.mins.defined() || w.mins.numel() == 0 ||
                 (w.mins.scalar_type() == at::kChar && w.mins.numel() == 16 && w.mins.is_contiguous())),
                "int4 weight, IQ4 layout: uint8 codes [N / 16, K / 32, 256] with float16 d [N / 16, K / 32, 16] (or "
                "[.., 272] with d [N / 16, K / 256, 16]), and no minimums or an int8 [16] table of the codes' values");
  } else if (w.bits == 5) {
    TORCH_CHECK(w.data.scalar_type() == at::kByte && w.data.dim() == 3 && w.data.size(2) == 40 &&
                w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 && w.mins.defined() &&
                w.mins.sizes() == w.scales.sizes() && w.mins.scalar_type() == at::kHalf &&
                w.data.numel() * 8 == w.n() * w.k() * 5 && w.data.is_contiguous() && w.scales.is_contiguous() &&
                w.mins.is_contiguous(), "int5 weight: uint8 codes [N / 16, K / 4, 40] with float16 scales and minimums");
  } else if (w.bits == 6 || w.bits == 3 || w.bits == 2) {
    const int64_t size = sub_block_bytes(w.bits);
    TORCH_CHECK(w.data.scalar_type() == at::kByte && w.data.dim() == 3 && w.data.size(2) == size &&
                w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 && w.scales.size(0) == w.data.size(0) &&
                w.scales.size(1) * 16 == w.data.size(1) && w.scales.size(2) == 16 && w.data.is_contiguous() &&
                w.scales.is_contiguous() &&
                (w.bits != 2 || (w.mins.defined() && w.mins.sizes() == w.scales.sizes() &&
                                 w.mins.scalar_type() == at::kHalf && w.mins.is_contiguous())),
                "int", w.bits, " weight: uint8 codes [N / 16, K / 16, ", size,
                "] with float16 scales [N / 16, K / 256, 16]", w.bits == 2 ? " and minimums likewise" : "");
  } else if (w.bits == 4) {
    const bool mins = w.mins.defined() && w.mins.numel() > 0;
    TORCH_CHECK(w.data.scalar_type() == at::kByte && w.scales.scalar_type() == at::kHalf &&
                (!mins || w.mins.scalar_type() == at::kHalf), "int4 weight: uint8 codes with float16 scales and minimums");
    TORCH_CHECK(w.scales.dim() == 3 && w.data.numel() * 2 == w.n() * w.k() && (!mins || w.mins.sizes() == w.scales.sizes()) &&
                w.data.is_contiguous() && w.scales.is_contiguous() && (!mins || w.mins.is_contiguous()),
                "int4 weight: codes, scales and minimums disagree");
  } else if (w.bits == 8) {
    TORCH_CHECK(w.data.scalar_type() == at::kChar && w.scales.scalar_type() == at::kHalf && w.scales.dim() == 3 &&
                w.data.numel() == w.n() * w.k() && w.data.is_contiguous() && w.scales.is_contiguous(),
                "int8 weight: int8 codes with float16 scales per group of 32");
  } else {
    TORCH_CHECK(w.data.dim() == 3 && w.data.size(2) == 16 && w.data.is_contiguous() &&
                (w.data.scalar_type() == at::kFloat || w.data.scalar_type() == at::kBFloat16),
                "dense weight: a contiguous float32 or bfloat16 [N / 16, K, 16] tensor");
  }
}

int64_t QuantWeightRef::n() const { return bits == 16 ? data.size(0) * 16 : scales.size(0) * 16; }
int64_t QuantWeightRef::k() const {
  return bits == 16                           ? data.size(1)
         : bits <= 3 || bits == 6 || table()  ? data.size(1) * 16
         : kform() || iq4()                   ? data.size(1) * 32
                                              : scales.size(1) * 32;
}

void prepare_range(const at::Tensor& x, const CellPart& p, const Activations& a, int64_t bits, int64_t isa) {
  dispatch_float_bf16(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (bits == 16) {
      RADIXLM_ISA_CALL(isa, widen_rows<T>, x.data_ptr<T>(), p.r0, p.r1, p.u0 * 64, p.u1 * 64, x.size(1), a.xf);
    } else {
      RADIXLM_ISA_CALL(isa, quantize_rows<T>, x.data_ptr<T>(), p.r0, p.r1, p.u0, p.u1, a.q);
    }
  });
}

void linear_tiles(const QuantWeightRef& w, const Activations& a, int64_t t0, int64_t t1, at::Tensor& y, int64_t col0,
                  int64_t isa) {
  const int64_t m = y.size(0), n = y.size(1);  // n: y's row stride; tile t writes columns col0 + 16 t ..
  dispatch_float_bf16(y, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* out = y.data_ptr<T>() + col0;
    if (w.table()) {
      RADIXLM_ISA_CALL(isa, table_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(),
                       w.mins.data_ptr<int8_t>(), n, t0, t1, a.q, m, out);
    } else if (w.iq4()) {
      const bool own = w.mins.defined() && w.mins.numel() == 16;  // the weight's own values, else IQ4_NL's
      RADIXLM_ISA_CALL(isa, iq4_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(),
                       own ? w.mins.data_ptr<int8_t>() : kIq4Values.v, w.iq4_xs(), n, t0, t1, a.q, m, out);
    } else if (w.bits == 4) {
      const at::Half* mn = w.mins.defined() && w.mins.numel() > 0 ? w.mins.data_ptr<at::Half>() : nullptr;
      RADIXLM_ISA_CALL(isa, int4_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(), mn, w.kform(), n,
                       t0, t1, a.q, m, out);
    } else if (w.bits == 5) {
      RADIXLM_ISA_CALL(isa, int5_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(),
                       w.mins.data_ptr<at::Half>(), w.kform(), n, t0, t1, a.q, m, out);
    } else if (w.bits == 6) {
      RADIXLM_ISA_CALL(isa, int6_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(), n, t0, t1, a.q, m,
                       out);
    } else if (w.bits == 2) {
      RADIXLM_ISA_CALL(isa, int2_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(),
                       w.mins.data_ptr<at::Half>(), n, t0, t1, a.q, m, out);
    } else if (w.bits == 3) {
      RADIXLM_ISA_CALL(isa, int3_tiles<T>, w.data.data_ptr<uint8_t>(), w.scales.data_ptr<at::Half>(), n, t0, t1, a.q, m,
                       out);
    } else if (w.bits == 8) {
      RADIXLM_ISA_CALL(isa, int8_tiles<T>, w.data.data_ptr<int8_t>(), w.scales.data_ptr<at::Half>(), n, t0, t1, a.q, m,
                       out);
    } else {
      RADIXLM_ISA_CALL(isa, dense_tiles<T>, w.data.data_ptr<T>(), n, w.k(), t0, t1, a.xf, m, out);
    }
  });
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa) {
  return linear(x, QuantWeightRef{4, w, d, mn}, isa);
}

at::Tensor int5_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa) {
  return linear(x, QuantWeightRef{5, w, d, mn}, isa);
}

at::Tensor int6_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa) {
  return linear(x, QuantWeightRef{6, w, d, at::Tensor()}, isa);
}

at::Tensor int2_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor& mn, int64_t isa) {
  return linear(x, QuantWeightRef{2, w, d, mn}, isa);
}

at::Tensor int3_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa) {
  return linear(x, QuantWeightRef{3, w, d, at::Tensor()}, isa);
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, int64_t isa) {
  return linear(x, QuantWeightRef{8, w, d, at::Tensor()}, isa);
}

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w, int64_t isa) {
  return linear(x, QuantWeightRef{16, w, at::Tensor(), at::Tensor()}, isa);
}

// Rows ids [T] of an int8 weight in its matmul layout -> [T, K] in dtype (an embedding lookup of a table kept as
// GGUF's Q8_0): each value q d computed in float32 and rounded once, as cpu_matmul.dequantize_int8 gives it. Row r
// is lane r % 16 of tile r / 16: its 4 values of each k-quad at bytes 4 (r % 16) .. + 3, its d per group of 32.
at::Tensor int8_rows(const at::Tensor& w, const at::Tensor& d, const at::Tensor& ids, at::ScalarType dtype) {
  check_weight(QuantWeightRef{8, w, d, at::Tensor()});
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "ids must be an int64 [T] tensor");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "int8 rows come as float32 or bfloat16");
  const int64_t n = d.size(0) * 16, groups = d.size(1), k = groups * 32;
  const at::Tensor idc = ids.contiguous();
  const int64_t* id = idc.data_ptr<int64_t>();
  at::Tensor y = at::empty({ids.numel(), k}, at::TensorOptions().dtype(dtype));
  dispatch_float_bf16(y, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    for (int64_t t = 0; t < ids.numel(); ++t) {
      const int64_t r = id[t], tile = r / 16, lane = r % 16;
      TORCH_CHECK(r >= 0 && r < n, "row id ", r, " is outside the table's ", n, " rows");
      const int8_t* q = w.data_ptr<int8_t>() + tile * k * 16 + lane * 4;  // k-quad j's 4 values at q + 64 j
      const at::Half* dr = d.data_ptr<at::Half>() + tile * groups * 16 + lane;  // group g's d at dr[16 g]
      T* out = y.data_ptr<T>() + t * k;
      for (int64_t c = 0; c < k; ++c) {
        out[c] = static_cast<T>(static_cast<float>(q[c / 4 * 64 + c % 4]) * static_cast<float>(dr[c / 32 * 16]));
      }
    }
  });
  return y;
}

}  // namespace radixlm_cpu

TORCH_LIBRARY(radixlm_cpu, m) {
  m.def("isa_supported(int isa) -> bool", [](int64_t isa) { return radixlm_cpu::isa_supported(isa); });
  m.def("int4_linear(Tensor x, Tensor w, Tensor d, Tensor mn, int isa) -> Tensor");
  m.def("int5_linear(Tensor x, Tensor w, Tensor d, Tensor mn, int isa) -> Tensor");
  m.def("int6_linear(Tensor x, Tensor w, Tensor d, int isa) -> Tensor");
  m.def("int3_linear(Tensor x, Tensor w, Tensor d, int isa) -> Tensor");
  m.def("int2_linear(Tensor x, Tensor w, Tensor d, Tensor mn, int isa) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor w, Tensor d, int isa) -> Tensor");
  m.def("dense_linear(Tensor x, Tensor w, int isa) -> Tensor");
  m.def("int8_rows(Tensor w, Tensor d, Tensor ids, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm_cpu, CPU, m) {
  m.impl("int4_linear", &radixlm_cpu::int4_linear);
  m.impl("int5_linear", &radixlm_cpu::int5_linear);
  m.impl("int6_linear", &radixlm_cpu::int6_linear);
  m.impl("int3_linear", &radixlm_cpu::int3_linear);
  m.impl("int2_linear", &radixlm_cpu::int2_linear);
  m.impl("int8_linear", &radixlm_cpu::int8_linear);
  m.impl("dense_linear", &radixlm_cpu::dense_linear);
  m.impl("int8_rows", &radixlm_cpu::int8_rows);
}
