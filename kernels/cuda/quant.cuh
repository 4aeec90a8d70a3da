// FP32 -> E4M3 codes with one instruction per pair: cvt.rn.satfinite.e4m3x2.f32 (SASS F2FP.SATFINITE.E4M3.F32).
//
// What it promises (kernels/README.md, "Quantisation"): round to nearest, ties to even, with E4M3's subnormals; finite
// values beyond +-448 and +-inf saturate to +-448 (code 0x7E / 0xFE), which is the spec's clamp-then-round; NaN stays
// NaN. So it is bit-equal to torch's float8_e4m3fn cast of clamp(x, -448, 448), and to the unclamped cast up to
// magnitude 464 (the tie between 448 and 480, which rounds to even, 448). Above 464 torch's cast is not relied on:
// c10's scalar conversion gives NaN there (480 is no E4M3 value), torch 2.13's CPU cast saturates.
#pragma once
#include <cstdint>

namespace dm {

// Two codes in one 16-bit word, `lo` in the low byte (the PTX packs its first source operand into the high byte).
__device__ __forceinline__ uint16_t cvt_e4m3x2(float lo, float hi) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
}

// Four codes in one register, byte i from v[i]: the form an RS wgmma's A fragment takes.
__device__ __forceinline__ uint32_t cvt_e4m3x4(float v0, float v1, float v2, float v3) {
  return uint32_t(cvt_e4m3x2(v0, v1)) | (uint32_t(cvt_e4m3x2(v2, v3)) << 16);
}

}  // namespace dm
