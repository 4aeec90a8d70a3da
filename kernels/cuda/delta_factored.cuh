// The parameters of matched's δ pass with dŜ's row scales (delta_factored.cu), a plain C struct that ctypes mirrors
// field for field (deltamatch.kernels.cuda_lib.DeltaFactoredParams): keep the two in the same order.
#pragma once
#include <cstdint>

extern "C" {

struct DeltaFactoredParams {
  const uint8_t* q8;    // Q̂ codes (B, H, N_pad, D), one scale per 128 queries
  const uint8_t* k8;    // K̂ codes (B, H_kv, N_pad, D), centred, one scale per 64 keys
  const uint8_t* v8;    // V̂ codes (B, H_kv, N_pad, D), one scale per 64 keys
  const uint8_t* do8;   // dÔ codes token-major (B, H, N_pad, D), one scale per 128 queries
  const float* sq;      // (B, H, N_pad / 128)
  const float* sk;      // (B, H_kv, N_pad / 64)
  const float* sv;      // (B, H_kv, N_pad / 64)
  const float* sdo;     // (B, H, N_pad / 128)
  const float* lse2;    // (B, H, N_pad)
  float* delta;         // (B, H, N_pad): δ_i = Σ_j P_ij dP̂_ij, written
  float* rs;            // (B, H, N_pad): dŜ's row scales s_i, written
  float* irs;           // (B, H, N_pad): div.full(1, s_i), written (the dK/dV kernel's per-tile factor)
  int b, h, h_kv, n, n_pad;
  float qk_scale;       // softmax_scale · log2(e), rounded to FP32 as Triton's launch does
  int causal;
};

}  // extern "C"
