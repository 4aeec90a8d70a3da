// The parameters of the fused factored dK/dV kernel (dkdv_factored.cu), a plain C struct that ctypes mirrors field for
// field (deltamatch.kernels.cuda_lib.DkdvFactoredParams): keep the two in the same order.
#pragma once
#include <cstdint>

extern "C" {

struct DkdvFactoredParams {
  const uint8_t* q8;    // Q̂ codes (B, H, N_pad, D), one scale per 128 queries: Sᵀ's B operand
  const uint8_t* k8;    // K̂ codes (B, H_kv, N_pad, D), centred, one scale per 64 keys
  const uint8_t* v8;    // V̂ codes (B, H_kv, N_pad, D), one scale per 64 keys
  const uint8_t* do8;   // dÔ codes token-major (B, H, N_pad, D), one scale per 128 queries: dP̂ᵀ's B operand
  const uint8_t* q8t;   // Q'ᶜ codes channel-major (B, H, D, N_pad): Q' = s ⊙ Q, one scale per channel (dK's B)
  const uint8_t* do8t;  // dÔᶜ codes channel-major (B, H, D, N_pad), one scale per channel (dV's B)
  const float* sq;      // (B, H, N_pad / 128)
  const float* sk;      // (B, H_kv, N_pad / 64)
  const float* sv;      // (B, H_kv, N_pad / 64)
  const float* sdo;     // (B, H, N_pad / 128)
  const float* sqc;     // (B, H, D): Q''s channel scales
  const float* sdoc;    // (B, H, D): dÔᶜ's channel scales
  const float* rs;      // (B, H, N_pad): dŜ's row scales s (matched's δ pass)
  const float* irs;     // (B, H, N_pad): div.full(1, s), as the δ pass writes it beside s (the per-tile dŜ)
  const float* lse2;    // (B, H, N_pad)
  const float* delta;   // (B, H, N_pad): matched's δ
  void* dk;             // (B, N, H_kv, D) bf16 or fp16; dk and dv share the element strides below, D contiguous
  void* dv;
  int64_t stride_b, stride_n, stride_h;
  int b, h, h_kv, n, n_pad;
  float qk_scale;       // softmax_scale · log2(e), rounded to FP32 as Triton's launch does
  float softmax_scale;
  int causal, out_fp16;
  // dQ in the same kernel (FA3's way), where dq_acc is set: each 64-query tile's dŜ over the CTA's 128 keys times
  // K̂ᶜ is added into dq_acc by the bulk-copy engine, then dq = ((dq_acc · s) · s_Kᶜ[d]) · softmax_scale, as
  // dq_factored.cu's epilogue. Without dq_sem the FP32 adds land in any order (not bit-reproducible).
  const uint8_t* k8t;   // K̂ᶜ codes channel-major (B, H_kv, D, N_pad), one scale per channel (dQ's B)
  const float* skc;     // (B, H_kv, D): K̂ᶜ's channel scales
  float* dq_acc;        // (B, H, N_pad, D) FP32 scratch, or null (no dQ); its 64-row blocks in the kernel's order;
                        // zeroed by the launch unless the adds are ordered (each tile's first add then stores)
  void* dq;             // (B, N, H, D) bf16 or fp16, element strides below, D contiguous
  int64_t dq_stride_b, dq_stride_n, dq_stride_h;
  // With dq_sem the adds into each 64-query tile land in one order, decreasing key blocks (FA3's deterministic mode),
  // and dQ is bit-reproducible: the CTAs are launched key block by key block from the last, kv heads interleaved in
  // sections of dq_section_heads (whose query tiles then share L2), and each waits on the tile's counter for the key
  // blocks after its own before its add.
  int* dq_sem;          // (B, H, N_pad / 64) + 1 int32 scratch, or null; zeroed by the launch (the last int: the
                        // persistent form's count of key blocks taken)
  int dq_section_heads; // with dq_sem: >= 1
  int dq_sync;          // with dq_sem, how an add is ordered (DqSync: 11 what cuda_lib dispatches, 0 the memory
                        // model's order, the others a benchmark's controls)
};

}  // extern "C"
