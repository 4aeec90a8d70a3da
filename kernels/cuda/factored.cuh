// What the CUDA kernels of matched_factored's backward share (dv_factored.cu, dk_factored.cu, dkdv_factored.cu,
// dq_factored.cu): the tile sizes, Triton's query-tile schedule, the FP32 helpers whose PTX Triton's kernels use, the
// accumulator -> A-fragment cast, the per-head channel rescale, the promotion's add, the TMA pipeline's tile cursor,
// the warp-specialised kernels' shape and stage walk, and the host's launch preparation and tensor-map encoding.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "quant.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace factored {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kBlockN = 64;    // keys per CTA: one K̂/V̂ scale block, wgmma's M
constexpr int kBlockM = 64;    // queries per tile: the promotion depth and the K of the dV product
constexpr int kHeadDim = 128;
// Token-major tiles of D codes a row (Q̂, K̂, V̂, dÔ) as TMA writes them: rows of 128 bytes in the 128-byte swizzle at
// D = 128, rows of 64 bytes in the 64-byte swizzle at D = 64 (the δ pass's D = 64 build, delta_wide.cu).
template <int D>
struct RowTileOf;
template <>
struct RowTileOf<128> {
  using type = KMajor128<Swizzle::k128B>;
  static constexpr CUtensorMapSwizzle kMapSwizzle = CU_TENSOR_MAP_SWIZZLE_128B;  // what TMA writes it with
};
template <>
struct RowTileOf<64> {
  using type = KMajor64Swizzle64;
  static constexpr CUtensorMapSwizzle kMapSwizzle = CU_TENSOR_MAP_SWIZZLE_64B;
};
template <int D>
using RowTile = typename RowTileOf<D>::type;
using QTile = RowTile<kHeadDim>;  // K̂ [64 keys, D], Q̂ [64 queries, D]
using ChannelTile = KMajor64Swizzle64;  // channel-major codes [D, 64 queries] as TMA's SWIZZLE_64B writes them
constexpr int kTileSteps = kBlockM / 32;  // k = 32 steps of a product over one tile's queries

// This thread's place in its warpgroup's accumulator layout (wgmma.cuh): warp w of the group, row group g, quad lane q.
// The warp is taken modulo 4 so that a consumer warpgroup other than the first (dkdv_factored.cu) sees the same layout.
struct Lane {
  int warp, g, q;
};
// This thread's warpgroup (threadIdx.x / 128) as a value ptxas knows to be warp-uniform: broadcast from lane 0
// (CUTLASS's canonical_warp_group_idx). From threadIdx.x alone it lives in an ordinary register, and so does every
// shared-memory address and wgmma descriptor derived from it (which half's K̂, V̂, Q̂ or dÔ a consumer reads): each
// wgmma then takes its descriptors through R2UR. Broadcast, they stay on the uniform datapath. Taken where an A/B on
// the H200 said so (kernels/NOTES.md, session 25): the dK/dV kernel with dQ 4.51 → 4.27 ms a step; the forward over
// 128-key tiles lost 3% with it (ptxas laid its loop out anew) and the δ pass did not move, so they keep threadIdx.x.
__device__ __forceinline__ int warpgroup_role() { return __shfl_sync(0xffffffffu, int(threadIdx.x / kThreads), 0); }

__device__ __forceinline__ Lane lane() {
  return {int(threadIdx.x / 32) % 4, int(threadIdx.x % 32) / 4, int(threadIdx.x % 4)};
}

// A plain global store of one FP32 written as PTX, for a value stored once after a kernel's main loop: the same store
// as C++ (`*at = value`) behind a run-time null test made ptxas lay the forward's main loop out anew (the same
// instructions, another order, and 4.4% slower on the H200: kernels/NOTES.md, session 30); this form leaves the loop as
// it was without the store.
__device__ __forceinline__ void store_f32(float* at, float value) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(at), "f"(value) : "memory");
}

__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// 2^x on the FMA pipe (FlashAttention-4's exponential emulation), for a share of a tile's elements while the rest take
// MUFU, whose 16 results a cycle an SM match FP8's wgmma rate at D = 128 (kernels/NOTES.md, session 28). Cody-Waite:
// x = j + f with j = round(x) (the 1.5·2^23 shifter) and f in [−0.5, 0.5]; 2^f by a minimax polynomial of DEGREE 3
// (relative error 7.5e-5, for P that becomes E4M3 in the forward) or 5 (2.3e-7 evaluated in FP32, the order of
// ex2.approx's own error, for δ's P, which must stay the backward's P up to FP32 round-off); times 2^j built in the
// exponent field. x is clamped at −127 with NaN kept (max.NaN): from −126.5 down the factor 2^j is +0, as
// ex2.approx.ftz flushes, −inf gives +0, and NaN stays NaN (p · 0 = NaN). For x ≤ 127.5.
template <int DEGREE>
__device__ __forceinline__ float ex2_poly(float x) {
  static_assert(DEGREE == 3 || DEGREE == 5, "coefficients are fitted for degrees 3 and 5");
  constexpr float kShifter = 12582912.0f;  // 1.5 · 2^23: x + it rounds x to an integer in the low mantissa bits
  float xc;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(xc) : "f"(x), "f"(-127.0f));
  const float t = __fadd_rn(xc, kShifter);
  const float f = __fsub_rn(xc, __fsub_rn(t, kShifter));
  float p;
  if constexpr (DEGREE == 3) {
    p = fmaf(fmaf(fmaf(0.055171433836221695f, f, 0.24261081218719482f), f, 0.6932609677314758f), f,
             0.9999281167984009f);
  } else {
    p = fmaf(fmaf(fmaf(fmaf(fmaf(0.0013276454992592335f, f, 0.009675540030002594f), f, 0.05550713464617729f), f,
                        0.24022120237350464f), f, 0.6931469440460205f), f, 1.0000001192092896f);
  }
  // t's bits are 0x4B400000 + j; shifted by 23 the constant leaves (its low 9 bits are 0): 2^j = (j + 127) << 23
  return __fmul_rn(p, __int_as_float(int(uint32_t(__float_as_int(t)) << 23) + 0x3F800000));
}

// 2^x of an element of 8-key chunk i (compile-time once unrolled): ex2_poly<DEGREE> where a variant emulates that
// chunk (EMULATE > 0 and i % EMULATE == EMULATE − 1: every EMULATE-th chunk), else ex2.approx on MUFU.
template <int EMULATE, int DEGREE>
__device__ __forceinline__ float ex2_of_chunk(int i, float x) {
  return EMULATE > 0 && i % EMULATE == EMULATE - 1 ? ex2_poly<DEGREE>(x) : ex2_approx_ftz(x);
}

constexpr float kLog2Of448 = 8.807354922057604f;  // log2(E4M3's largest finite value), rounded to FP32

// An upper bound on max_j P_ij = max_j 2^fma(S_ij, c_j, −lse2_i) for the δ pass without its per-element max (the
// variants of cuda_lib.DELTA_ROW_MAX), from the forward's row max m_i = fl(max_j fl(S_ij c_j) − kLog2Of448)
// (fwd_wide.cu keeps m so; the same codes and scales c_j = (s_q·s_k)·qk_scale give the same S_ij c_j).
// y = fl(fl(m + kLog2Of448) − lse2) is within 2^-22 (|m| + |y| + 16) of the exact max_j S_ij c_j − lse2 (four roundings
// of half an ulp each, every operand below |m| + 9 or |y|), and each element's exponent fma(S_ij, c_j, −lse2_i) is at
// most that max rounded once more. The slack is twice that: its second half, at least 2^-18 in the exponent (≥ 1.8e-6
// relative), covers the rounding of y + slack and the exponentials' own error (ex2.approx 2 ulps, ex2_poly<5>
// 2.3e-7), so ex2.approx of y + slack lies above every P of the row. s is then a bound as before, larger by
// ≈ 2^-20 (|m| + |y| + 16) relative: not the per-element max's bits, an ulp-level change
// (tests/kernels/test_cuda_build.py holds a model of these steps to this).
__device__ __forceinline__ float p_max_bound(float m, float lse2) {
  const float y = __fsub_rn(__fadd_rn(m, kLog2Of448), lse2);
  const float slack = __fmul_rn(__fadd_rn(__fadd_rn(fabsf(m), fabsf(y)), 16.0f), 4.76837158203125e-7f);  // 2^-21
  return ex2_approx_ftz(__fadd_rn(y, slack));
}

__device__ __forceinline__ float div_full(float a, float b) {
  float y;
  asm("div.full.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// The max and the sum over this thread's quad of one value per thread (Triton's butterfly: xor 2, then xor 1).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
}

// Triton's query-tile order for one key block (triton_bwd._attn_bwd_dkdv_kernel with SPLIT, BLOCK_M = BLOCK_N = 64):
// the unmasked range [diag_end, full_end), then the masked one from lo, jumping from diag_end to tail.
struct Schedule {
  int lo, diag_end, full_end, tail, unmasked, tiles;

  __device__ Schedule(int start_n, int n, bool causal) {
    full_end = (n / kBlockM) * kBlockM;
    lo = 0;
    diag_end = 0;
    if (causal) {
      lo = start_n;
      diag_end = max(lo, min(start_n + kBlockN, full_end));
    }
    tail = max(full_end, lo);
    if (start_n + kBlockN > n) {  // the ragged last key block: every tile masked
      diag_end = lo;
      tail = lo;
      full_end = lo;
    }
    unmasked = full_end > diag_end ? (full_end - diag_end + kBlockM - 1) / kBlockM : 0;
    const int hi = n - (tail - diag_end);
    tiles = unmasked + (hi > lo ? (hi - lo + kBlockM - 1) / kBlockM : 0);
  }
  __device__ int start(int it) const {  // the first query of tile `it`
    if (it < unmasked) return diag_end + kBlockM * it;
    const int tile_m = lo + kBlockM * (it - unmasked);
    return tile_m < diag_end ? tile_m : tile_m + (tail - diag_end);
  }
  __device__ bool masked(int it) const { return it >= unmasked; }
};

// The same tiles in increasing order: the causal diagonal [lo, diag_end) (masked), the unmasked range, then the
// ragged end from tail (masked). The ordered dQ-in-dK/dV form walks this: each key block then reaches a query tile
// two tiles after the next key block does, the order its adds into dQ wait in (dkdv_factored.cu). Its dK and dV sum
// the same products in another order than Triton's: not its bits.
struct IncreasingSchedule : Schedule {
  int diag;

  __device__ IncreasingSchedule(int start_n, int n, bool causal) : Schedule(start_n, n, causal) {
    diag = (diag_end - lo) / kBlockM;
  }
  __device__ int start(int it) const {
    if (it < diag) return lo + kBlockM * it;
    if (it < diag + unmasked) return diag_end + kBlockM * (it - diag);
    return tail + kBlockM * (it - diag - unmasked);
  }
  __device__ bool masked(int it) const { return it < diag || it >= diag + unmasked; }
};

// The key tiles of a block of `rows` queries from start_m, KEYS keys a tile, in Triton's order for the forward
// (triton_fwd._attn_fwd_kernel), dQ and the δ pass (triton_bwd._key_ranges), which agree: [0, full_end) unmasked,
// then [full_end, hi) masked: the causal diagonal, or the ragged end; a tile never reaches past N_pad. A 64-query half
// over 64-key tiles by default (KeySchedule); the δ pass's blocks are 128 queries. Over 128-key tiles (WideTiles,
// 128-query CTAs) the masked range is one tile, the last.
template <int KEYS>
struct KeyTiles {
  int unmasked, tiles;
  __device__ KeyTiles(int start_m, int n, bool causal, int rows = kBlockM) {
    int full_end = (n / KEYS) * KEYS, hi = n;
    if (causal) {
      full_end = min(full_end, start_m);
      hi = start_m + rows;
    }
    unmasked = full_end / KEYS;
    tiles = unmasked + (hi > full_end ? (hi - full_end + KEYS - 1) / KEYS : 0);
  }
  __device__ int start(int it) const { return KEYS * it; }
  __device__ bool masked(int it) const { return it >= unmasked; }
};
using KeySchedule = KeyTiles<kBlockN>;
constexpr int kWideKeys = 128;  // keys per tile of the kernels over 128-key tiles (fwd_wide.cu, delta_wide.cu)
using WideTiles = KeyTiles<kWideKeys>;

// e4m3(st), an FP32 accumulator [64 keys, 64 queries] (P̂ᵀ for dV, dŜᵀ for dK), as the A fragments of the product
// over the tile's 64 queries (two k = 32 steps). FRAGMENT_ORDER: the product's B operand holds its tokens in
// triton_quant.fragment_token_order (position 4q + j of each 16-token group: token 2q + (j & 1) + 8 (j >> 1)), so
// lane q's four accumulator bytes of a 16-column half are already its A fragment's k = 4q .. 4q+3 and need no
// acc_to_a_fragment (two shuffles and a byte permute per register).
template <bool FRAGMENT_ORDER = false>
__device__ __forceinline__ void to_fragments(const float (&st)[kBlockM / 2], uint32_t (&frag)[kTileSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int h16 = 2 * kk + r / 2, v0 = 8 * h16 + 2 * (r % 2);  // 16-query half h16, key row g or g + 8
      const uint32_t codes = cvt_e4m3x4(st[v0], st[v0 + 1], st[v0 + 4], st[v0 + 5]);
      frag[kk][r] = FRAGMENT_ORDER ? codes : acc_to_a_fragment(codes);
    }
  }
}

// acc · s_prev[d] / s_next[d] before the first tile of a query head (div.full, Triton's `/`; s_prev = 1 for the
// first head), so that a dV or dK accumulator stays in the units of the current head's channel scales (dÔᶜ, Q').
// W: the accumulator's registers, D / 2 for D channels.
template <int W>
__device__ __forceinline__ void rescale_channels(float (&dv)[W], const float* prev, const float* next) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < W / 4; ++i) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * i + 2 * q + c;
      const float ratio = div_full(prev ? prev[col] : 1.0f, next[col]);
      dv[4 * i + c] = __fmul_rn(dv[4 * i + c], ratio);
      dv[4 * i + 2 + c] = __fmul_rn(dv[4 * i + 2 + c], ratio);
    }
  }
}

template <bool PROMOTE, int W>
__device__ __forceinline__ void finish_acc(float (&dv)[W], float (&part)[W]) {
  if constexpr (PROMOTE) {
    fence_operands(part);
#pragma unroll
    for (int i = 0; i < W; ++i) dv[i] = __fadd_rn(dv[i], part[i]);
  } else {
    fence_operands(dv);
  }
}

// The dynamic shared memory at `raw` as a T at the next 1024-byte boundary (the 128-byte swizzle's alignment); the
// launch asks for sizeof(T) + 1024 bytes.
template <typename T>
__device__ __forceinline__ T& aligned_smem(uint8_t* raw) {
  return *reinterpret_cast<T*>(raw + ((1024 - static_cast<uint32_t>(__cvta_generic_to_shared(raw)) % 1024) % 1024));
}

// K̂ (64 keys x D, 128-byte swizzle in shared memory) as this thread's A fragments of Sᵀ = K̂ Q̂ᵀ, one per k = 32 step:
// register r of step kk holds row 16w + g + 8(r % 2), bytes 32kk + 16(r / 2) + 4q .. + 3 (wgmma.cuh's A layout).
__device__ __forceinline__ void load_k_fragments(const uint8_t* k, uint32_t (&kfrag)[QTile::kSteps][4]) {
  const auto [warp, g, q] = lane();
#pragma unroll
  for (int kk = 0; kk < QTile::kSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * warp + g + 8 * (r % 2), chunk = 2 * kk + r / 2;
      kfrag[kk][r] = *reinterpret_cast<const uint32_t*>(k + QTile::chunk_offset(row, chunk) + 4 * q);
    }
  }
}

// acc += frag · tileᵀ over one tile's 64 queries (two RS m64nDk32, D = 2W channels; the B tile channel-major in the
// 64-byte swizzle): dV's P̂ᵀ dÔᶜ and dK's dŜᵀ Q̂'ᶜ. PROMOTE: the product goes to `part` from zero (finish_acc adds it);
// otherwise the wgmma accumulates into `acc` itself.
template <bool PROMOTE, int W>
__device__ __forceinline__ void issue_channel_product(float (&acc)[W], float (&part)[W],
                                                      uint32_t (&frag)[kTileSteps][4], const uint8_t* tile) {
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) fence_operands(frag[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) {
    if constexpr (PROMOTE) {
      WgmmaE4M3<2 * W>::rs(part, frag[kk], ChannelTile::desc(tile, kk), kk > 0);
    } else {
      WgmmaE4M3<2 * W>::rs(acc, frag[kk], ChannelTile::desc(tile, kk), 1);
    }
  }
  wgmma_commit();
}

// One W-channel part (W = 64: a half, 32: a quarter) of the promoted channel product above into a W/2-register
// `part` (channels W·c ..: rows W·c .. of the channel-major tile, W·64 bytes on in the 64-byte swizzle), and its FP32
// add into the accumulator's registers of those channels (W/2 · c ..: an m64n128 accumulator's registers 4i .. 4i + 3
// hold channels 8i ..). Each element is the same k = 32 steps' sum as in the 128-channel product; the promotion's
// temporary is W/2 registers instead of 64.
template <int W>
__device__ __forceinline__ void issue_channel_part(float (&part)[W / 2], uint32_t (&frag)[kTileSteps][4],
                                                   const uint8_t* tile, int c) {
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) fence_operands(frag[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileSteps; ++kk) {
    WgmmaE4M3<W>::rs(part, frag[kk], ChannelTile::desc(tile + c * W * kBlockM, kk), kk > 0);
  }
  wgmma_commit();
}
template <int W>
__device__ __forceinline__ void finish_part(float (&acc)[kHeadDim / 2], float (&part)[W / 2], int c) {
  fence_operands(part);
#pragma unroll
  for (int i = 0; i < W / 2; ++i) acc[(W / 2) * c + i] = __fadd_rn(acc[(W / 2) * c + i], part[i]);
}

// Sᵀ = K̂ Q̂ᵀ and dP̂ᵀ = V̂ dÔᵀ of one tile, one wgmma group (rows of D codes, RowTile<D>).
template <int D = kHeadDim>
__device__ __forceinline__ void issue_s_dp(float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2], const uint8_t* k,
                                           const uint8_t* v, const uint8_t* q, const uint8_t* dout) {
  using Tile = RowTile<D>;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tile::kSteps; ++kk) {
    WgmmaE4M3<kBlockM>::ss(st, Tile::desc(k, kk), Tile::desc(q, kk), kk > 0);
  }
#pragma unroll
  for (int kk = 0; kk < Tile::kSteps; ++kk) {
    WgmmaE4M3<kBlockM>::ss(dpt, Tile::desc(v, kk), Tile::desc(dout, kk), kk > 0);
  }
  wgmma_commit();
}

// A Bᵀ over D for one tile of N rows of B (D / 32 SS m64nNk32; A and B K-major rows of D codes, RowTile<D>), one
// wgmma group: S = Q̂ K̂ᵀ of the forwards, S and dÔ V̂ᵀ of the δ pass over 128-key tiles.
template <int N, int D = kHeadDim>
__device__ __forceinline__ void issue_ss(float (&acc)[N / 2], const uint8_t* a, const uint8_t* b) {
  using Tile = RowTile<D>;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tile::kSteps; ++kk) {
    WgmmaE4M3<N>::ss(acc, Tile::desc(a, kk), Tile::desc(b, kk), kk > 0);
  }
  wgmma_commit();
}

// The stage barriers of a TMA pipeline, by one thread: `full` counts the issuing thread's arrival and the bytes,
// `empty` one arrival per consumer warp; `extra` (K̂, V̂ once) the issuing thread's. Visible to all after a barrier.
template <int STAGES>
__device__ __forceinline__ void init_stage_barriers(uint64_t (&full)[STAGES], uint64_t (&empty)[STAGES],
                                                    uint64_t* extra, int consumer_warps = kThreads / 32) {
#pragma unroll
  for (int i = 0; i < STAGES; ++i) {
    mbar_init(&full[i], 1);
    mbar_init(&empty[i], consumer_warps);
  }
  mbar_init(extra, 1);
  fence_mbar_init();
}

// dŜᵀ before its cast, in place in `dpt`, from Sᵀ (st) and dP̂ᵀ (dpt) of the 64-key block at start_n and the query
// tile at start_m, as Triton's factored dK launch forms it: P = ex2.approx.ftz(fma(Sᵀ, row_scale, −lse2)), masked;
// dS = P · fma(dP̂ᵀ, dp_scale, −δ); dŜᵀ = dS · div.full(1, s) (lse2 = 0, δ = 0, s = 1 for queries ≥ N, Triton's
// masked-load values). WITH_P: `st` becomes P · 448 (P̂ᵀ before its cast, Triton's dV launch), else it is left alone.
// INVERSES: `irs` holds div.full(1, s), as the δ pass writes it beside s (the same bits; forming it here costs ≈ 8
// instructions per query and tile: the division's range checks, MUFU.RCP and its correction); else it holds s.
// lse, delta and irs: shared-memory arrays of the tile's queries, 8-byte aligned (24 LDS.64 a tile where scalar loads
// took 48 LDS; in the dK/dV kernel with warpgroup_role 192 instructions fewer, the stack unchanged; before it, the
// same loads spilled 48 bytes more).
// FOLDED (with WITH_P and INVERSES): the host passes lse2 − log2(448) for lse and div.full(1, s) / 448 for irs, so the
// exponential gives P · 448 itself: P̂ᵀ needs no multiply, and dS · 448 · (1 / 448s) is dŜ (5 instructions an element
// where 6 form both; the bits within a few ulps of the unfolded ones, not equal).
template <bool WITH_P, bool INVERSES = true, bool FOLDED = false>
__device__ __forceinline__ void ds_tile(float (&st)[kBlockM / 2], float (&dpt)[kBlockM / 2], const float* lse,
                                        const float* delta, const float* irs, float row_scale, float dp_scale,
                                        bool masked, int start_n, int start_m, int n, bool causal) {
  static_assert(!FOLDED || (WITH_P && INVERSES), "folding 448 in needs P̂ᵀ and the inverses");
  const auto [warp, g, q] = lane();
#pragma unroll
  for (int i = 0; i < kBlockM / 8; ++i) {
    // this thread's two queries of the 8-query group, 8 i + 2 q and the next: an 8-byte load from each row-term array
    const float2 l2 = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * q);
    const float2 d2 = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * q);
    const float2 s2 = *reinterpret_cast<const float2*>(irs + 8 * i + 2 * q);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * i + 2 * q + c, query = start_m + col;
      float l = c ? l2.y : l2.x, d = c ? d2.y : d2.x, s = c ? s2.y : s2.x;
      if (masked && query >= n) l = 0.0f, d = 0.0f, s = 1.0f;  // Triton's `other` of its masked loads (1 = 1 / 1)
      const float inv_s = INVERSES ? s : div_full(1.0f, s);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int v = 2 * half + c, key = start_n + 16 * warp + g + 8 * half;
        float pv = ex2_approx_ftz(fmaf(st[4 * i + v], row_scale, -l));
        if (masked) {
          const bool visible = key < n && query < n && (!causal || query >= key);
          pv = visible ? pv : 0.0f;
        }
        const float ds = __fmul_rn(pv, fmaf(dpt[4 * i + v], dp_scale, -d));
        dpt[4 * i + v] = __fmul_rn(ds, inv_s);
        if constexpr (WITH_P) st[4 * i + v] = FOLDED ? pv : __fmul_rn(pv, 448.0f);
      }
    }
  }
}

// The epilogue of a [64 rows, D] accumulator (keys of dK/dV, queries of dQ), in two steps: finish_rows applies
// finish(value, half, channel) to each element (half: this thread's row g, or g + 8), store_finished_rows writes the
// results into `out` (B, N, heads, D) at head `head`, bf16 or fp16, rows start_n.. below n; element strides, D
// contiguous. Every value is finished before the first store: finish reads per-channel scales from global memory, and
// a store the compiler cannot prove apart from them would order each load after the store before it — one load's
// latency per element pair, 12 µs of a dK/dV CTA's epilogue on the H100 (kernels/NOTES.md, session 33), where
// finishing first lets the loads overlap. store_rows does both for one accumulator.
template <typename Finish, int W>
__device__ __forceinline__ void finish_rows(const float (&acc)[W], Finish finish, float (&y)[W]) {
  const int q = lane().q;
#pragma unroll
  for (int i = 0; i < W / 4; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      y[4 * i + 2 * half] = finish(acc[4 * i + 2 * half], half, 8 * i + 2 * q);
      y[4 * i + 2 * half + 1] = finish(acc[4 * i + 2 * half + 1], half, 8 * i + 2 * q + 1);
    }
  }
}

// One 16-byte store a thread for every four of its column pairs: a row's 16 contiguous bytes (8 columns) are held by the
// four lanes of its quad, a pair each, so the quad transposes each 4 x 4 block of pairs (chunks 4k..4k+3) and lane q
// stores chunk 4k + q whole. Where each lane stored its own pairs (4-byte stores), a warp's store wrote 8 rows x 16
// bytes, half of each 32-byte sector, and the dK/dV epilogue issued 64 of them a thread (kernels/NOTES.md, session 34).
// words[c]: this lane's pair of chunk 4k + c; returns the four pairs of chunk 4k + q in column order.
__device__ __forceinline__ uint4 quad_transpose(const uint32_t (&words)[4], int q) {
  const bool q0 = q & 1, q1 = q & 2;
  // lanes q and q ^ 2 swap the chunks whose bit 1 is not their own: each then holds chunks (q1, 0) and (q1, 1) of both
  uint32_t own[2], other[2];
#pragma unroll
  for (int c0 = 0; c0 < 2; ++c0) {
    own[c0] = q1 ? words[2 + c0] : words[c0];
    other[c0] = __shfl_xor_sync(0xFFFFFFFFu, q1 ? words[c0] : words[2 + c0], 2);
  }
  // lanes q and q ^ 1 swap the chunk that is not their own: each then holds chunk q of lanes q ^ d, d = 0..3
  const uint32_t held[4] = {q0 ? own[1] : own[0], __shfl_xor_sync(0xFFFFFFFFu, q0 ? own[0] : own[1], 1),
                            q0 ? other[1] : other[0], __shfl_xor_sync(0xFFFFFFFFu, q0 ? other[0] : other[1], 1)};
  // column pair s of the chunk is lane s's: held[s ^ q]
  uint32_t a[4], out[4];
#pragma unroll
  for (int x = 0; x < 4; ++x) a[x] = q0 ? held[x ^ 1] : held[x];
#pragma unroll
  for (int x = 0; x < 4; ++x) out[x] = q1 ? a[x ^ 2] : a[x];
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A 16-byte global store written as PTX: as C++ (a uint4 assignment) ptxas split one of the forward's four a row into
// four 4-byte stores where its words did not sit in four consecutive registers (session 34's SASS check).
__device__ __forceinline__ void store_u32x4(void* at, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

template <bool FP16>
__device__ __forceinline__ uint32_t pack_pair(float x0, float x1) {
  if constexpr (FP16) {
    const __half2 v = __floats2half2_rn(x0, x1);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x0, x1);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <bool FP16, int W>
__device__ __forceinline__ void store_finished_rows_as(const float (&y)[W], void* out, int64_t stride_b,
                                                       int64_t stride_n, int64_t stride_h, int b, int head,
                                                       int start_n, int n) {
  const auto [warp, g, q] = lane();
  uint16_t* const base = static_cast<uint16_t*>(out) + int64_t(b) * stride_b + int64_t(head) * stride_h;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = start_n + 16 * warp + g + 8 * half;
#pragma unroll
    for (int k = 0; k < W / 16; ++k) {
      uint32_t words[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = 4 * k + c;  // chunk: columns 8i..8i + 7; this lane's pair 8i + 2q, + 1
        words[c] = pack_pair<FP16>(y[4 * i + 2 * half], y[4 * i + 2 * half + 1]);
      }
      const uint4 chunk = quad_transpose(words, q);  // every lane of the warp, before the row test
      if (key < n) store_u32x4(base + int64_t(key) * stride_n + 8 * (4 * k + q), chunk);
    }
  }
}

// `out`'s rows are 16-byte aligned (D contiguous, every stride a multiple of 8 elements: cuda_lib allocates them).
template <int W>
__device__ __forceinline__ void store_finished_rows(const float (&y)[W], void* out, bool fp16, int64_t stride_b,
                                                    int64_t stride_n, int64_t stride_h, int b, int head, int start_n,
                                                    int n) {
  if (fp16) {
    store_finished_rows_as<true>(y, out, stride_b, stride_n, stride_h, b, head, start_n, n);
  } else {
    store_finished_rows_as<false>(y, out, stride_b, stride_n, stride_h, b, head, start_n, n);
  }
}

// store_finished_rows's stores without the transpose: each lane its own column pairs, 4 bytes each. The dK/dV
// epilogue's form: there the transposed stores made the kernel 2.4–4.0% slower (the forward's 2.4–2.9% faster;
// kernels/NOTES.md, session 34).
template <int W>
__device__ __forceinline__ void store_finished_pairs(const float (&y)[W], void* out, bool fp16, int64_t stride_b,
                                                     int64_t stride_n, int64_t stride_h, int b, int head, int start_n,
                                                     int n) {
  const auto [warp, g, q] = lane();
#pragma unroll
  for (int i = 0; i < W / 4; ++i) {
    const int col = 8 * i + 2 * q;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = start_n + 16 * warp + g + 8 * half;
      if (key >= n) continue;
      const float x0 = y[4 * i + 2 * half];
      const float x1 = y[4 * i + 2 * half + 1];
      const int64_t at = int64_t(b) * stride_b + int64_t(key) * stride_n + int64_t(head) * stride_h + col;
      if (fp16) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(out) + at) = __floats2half2_rn(x0, x1);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + at) = __floats2bfloat162_rn(x0, x1);
      }
    }
  }
}

// ---- the epilogue through shared memory and the TMA (dkdv_factored.cu's `ws3xfdt`) -------------------------------
// A [64 rows, D] result in the output dtype is staged in shared memory as two boxes of 64 rows x 64 channels (128
// bytes a row) in TMA's 128-byte swizzle, then written by two tensor stores of one thread: 8 stmatrix a thread and two
// bulk stores a warpgroup and tensor, where store_finished_pairs issues 64 4-byte global stores a thread. Rows past
// the tensor's N are not written (the TMA clips the box).

// Four 8 x 8 matrices of 16-bit values from a warp's accumulator fragments into shared memory (PTX "stmatrix"): lane l
// gives the address of row l % 8 of matrix l / 8; register m holds matrix m's (row l / 4, columns 2(l % 4) and + 1),
// the accumulator layout's (g, 2q) pair.
__device__ __forceinline__ void stmatrix_x4(uint32_t at, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// One consumer warpgroup's own barrier (named barriers 3 and 4: 0 is __syncthreads', 1 and 2 the turns').
__device__ __forceinline__ void group_sync(int half) {
  if (half == 0) {
    asm volatile("bar.sync 3, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 4, 128;\n" ::: "memory");
  }
}

// The finished rows y (finish_rows' layout) packed to 16 bits in the 128-byte swizzle: row r's 16-byte chunk c at
// r · 128 + ((c ^ r % 8) · 16), each box 1024-byte aligned. At D = 128 into `box[c]`, channels 64c .. 64c + 63 of the
// 64 rows (8 KB each); at D = 64 into `box[w / 2]`, rows 32 · (w / 2) .. + 31 of the 64 channels (4 KB each; warp w
// holds rows 16w .. 16w + 15). An stmatrix_x4 writes chunks i and i + 1 of the warp's 16 rows (matrices: rows 0-7 and
// 8-15 of chunk i, then of i + 1); each 8 x 8 matrix's rows land in eight distinct chunks of 128 bytes, so no bank is
// written twice.
template <bool FP16, int D = kHeadDim>
__device__ __forceinline__ void stage_swizzled(const float (&y)[D / 2], uint8_t* box0, uint8_t* box1) {
  static_assert(D == kHeadDim || D == 64, "128-byte rows: two 64-channel boxes at D = 128, two 32-row boxes at 64");
  constexpr bool kChannelBoxes = D == kHeadDim;  // else row boxes: warp w's rows in box w / 2
  const int warp = lane().warp, l = int(threadIdx.x % 32), m = l / 8, r = l % 8;
  const uint32_t row = uint32_t(16 * (kChannelBoxes ? warp : warp % 2) + 8 * (m & 1) + r) * 128;
  const uint32_t at[2] = {smem_addr(box0) + row, smem_addr(box1) + row};
#pragma unroll
  for (int i = 0; i < D / 8; i += 2) {
    const uint32_t chunk = uint32_t(i % 8 + (m >> 1));
    const uint32_t box = kChannelBoxes ? at[i / 8] : warp < 2 ? at[0] : at[1];  // no runtime index into at
    stmatrix_x4(box + ((chunk ^ uint32_t(r)) << 4),
                pack_pair<FP16>(y[4 * i], y[4 * i + 1]), pack_pair<FP16>(y[4 * i + 2], y[4 * i + 3]),
                pack_pair<FP16>(y[4 * i + 4], y[4 * i + 5]), pack_pair<FP16>(y[4 * i + 6], y[4 * i + 7]));
  }
}

// Rows a box of store_rows_tma holds at head dim D (encode_out_rows' box_rows): 64 at D = 128 (a box is 64 of the
// channels), 32 at D = 64 (a box is every channel of half the rows).
template <int D = kHeadDim>
constexpr uint32_t kOutBoxRows = D == kHeadDim ? kBlockN : kBlockN / 2;

// y into `out` (the map of a (B, N, heads, D) tensor: encode_out_rows<D>) at head `head`, rows start_n .., by consumer
// warpgroup `half` through its free buffers box0, box1 (stage_swizzled's boxes). Every thread of the warpgroup calls
// it; before the first call the warpgroup is done reading the buffers (a group_sync after its last product), and
// between two calls a group_sync lets the issuer's wait for the first stores' reads order the second staging after
// them. The issuer (one thread of the warpgroup) waits for the reads before it returns, so the buffers are free again
// and the CTA may exit. Rows past N are left out by the TMA.
template <int D = kHeadDim>
__device__ __forceinline__ void store_rows_tma(const float (&y)[D / 2], bool fp16, uint8_t* box0, uint8_t* box1,
                                               const CUtensorMap* out, int b, int head, int start_n, int half) {
  if (fp16) {
    stage_swizzled<true, D>(y, box0, box1);
  } else {
    stage_swizzled<false, D>(y, box0, box1);
  }
  fence_async_shared();
  group_sync(half);
  if (threadIdx.x % kThreads == 0) {
    constexpr bool kChannelBoxes = D == kHeadDim;  // box1: the second 64 channels, else the second 32 rows
    tma_store_4d(out, box0, 0, head, start_n, b);
    tma_store_4d(out, box1, kChannelBoxes ? 64 : 0, head, start_n + (kChannelBoxes ? 0 : int(kOutBoxRows<D>)), b);
    bulk_wait_read<0>();
  }
}

template <typename Finish, int W>
__device__ __forceinline__ void store_rows(const float (&acc)[W], Finish finish, void* out, bool fp16,
                                           int64_t stride_b, int64_t stride_n, int64_t stride_h, int b, int head,
                                           int start_n, int n) {
  float y[W];
  finish_rows(acc, finish, y);
  store_finished_rows(y, out, fp16, stride_b, stride_n, stride_h, b, head, start_n, n);
}

// Tile j of a CTA's sequence (every query head of its GQA group, each head's tiles in Schedule order) without
// divisions: its query head, its place in that head's schedule, its pipeline stage and the stage's barrier phase.
template <int STAGES>
struct Cursor {
  int j, it, stage;
  uint32_t phase;
  int64_t bh;
  __device__ void advance(int tiles) {
    ++j;
    if (++it == tiles) it = 0, ++bh;
    if (++stage == STAGES) stage = 0, phase ^= 1;
  }
};

// ---- warp-specialised kernels with two consumer halves (dkdv_factored.cu, dq_factored.cu) ---------------------------
// One producer thread walks the tiles both consumer warpgroups (the CTA's two 64-row halves) read, in one sequence:
// the merge of the halves' own Triton orders (Walk), and writes each stage's tile, head and readers (StageInfo) before
// its `full` arrival, whose release publishes them. A consumer takes the stages in order (Ring::take): it reads the
// ones its half uses and releases the others once they have filled, so that every `empty` phase counts all eight
// consumer warps in order (an arrival before the fill could complete an earlier phase of that stage).

constexpr int kConsumers = 2;                              // consumer warpgroups, one per 64-row half
constexpr int kCtaRows = kConsumers * kBlockM;             // 128 keys (dK/dV) or queries (dQ) per CTA
constexpr int kCtaThreads = (kConsumers + 1) * kThreads;   // the producer warpgroup first
constexpr int kProducerRegs = 24, kConsumerRegs = 240;     // 24·128 + 240·256 = 168·384, the launch's share
// dkdv_factored.cu's dQ warpgroup form (`ws3xfd`): a fourth warpgroup for dQ's product, so the consumers give up 24
// registers each (their promotion split into 64-channel halves) and it takes 72: 24·128 + 208·256 + 72·128 = 128·512
constexpr int kDqGroupThreads = (kConsumers + 2) * kThreads;
constexpr int kDqGroupRegs = 72, kDqGroupConsumerRegs = 208;
// FlashAttention-3's turns of the two consumers (fwd_wide.cu's and delta_wide.cu's ping-pong). Named barriers 1 and 2
// (0 is __syncthreads'): consumer `half` waits on its own, 256 threads counting its 128 and the other consumer's 128
// arrivals. The ids are immediates: in registers they were two more values live across the loop, and the consumer
// spilled.
__device__ __forceinline__ void turn_wait(int half) {
  if (half == 0) {
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 256;\n" ::: "memory");
  }
}
__device__ __forceinline__ void turn_give(int half) {
  if (half == 0) {
    asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  } else {
    asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  }
}
// The `w4po` forms' staggered start (fwd_wide.cu, delta_wide.cu), once per CTA on the second half's turn barrier: the
// second consumer waits before its first tile (stagger_wait), the first lets it go once its first tile's P is formed
// (stagger_release), and from then on they run half a tile apart with no per-tile turns. Each consumer calls its own
// exactly once, so the barrier completes once.
__device__ __forceinline__ void stagger_wait(int half) {
  if (half == 1) turn_wait(1);
}
__device__ __forceinline__ void stagger_release(int half) {
  if (half == 0) turn_give(0);
}

constexpr int kUse0 = 1, kMasked0 = 4, kLast = 16;  // StageInfo flags: << h for half h

struct StageInfo {
  int start;    // the tile's first row (a query tile for dK/dV, a key tile for dQ)
  int flags;    // kUse0 << h: half h reads it; kMasked0 << h: in half h's masked range; kLast: the CTA's last stage
  int64_t bh;   // its query head
};

// A tile as one consumer sees it.
struct Tile {
  int stage;
  uint32_t phase;
  int start;
  bool masked;  // in its half's masked range (the causal diagonal, the ragged end)
  int64_t bh;
};

// The merge of two halves' schedules (Sched: `tiles`, `masked(i)`, `start(i)`, each half's order increasing or not),
// taking at each step the smaller next tile of the two (both halves when they agree), for `heads` query heads in
// turn: each half's own order is kept and every tile of each is visited once.
template <int STAGES, typename Sched>
struct Walk {
  Sched half0, half1;
  int i0 = 0, i1 = 0;  // each half's next tile in its schedule, within the current head
  int start = 0;       // this position's tile
  bool use0 = false, use1 = false;
  int stage = 0;
  uint32_t phase = 0;
  int64_t bh, bh_end;

  __device__ Walk(const Sched& first, const Sched& second, int64_t bh0, int heads)
      : half0(first), half1(second), bh(bh0), bh_end(bh0 + heads) {
    settle();
  }
  __device__ bool done() const { return bh == bh_end; }
  __device__ int flags() const {  // this position's StageInfo flags, before advance()
    const bool last = i0 + use0 == half0.tiles && i1 + use1 == half1.tiles && bh + 1 == bh_end;
    return (use0 ? kUse0 : 0) | (use1 ? kUse0 << 1 : 0) | (half0.masked(i0) ? kMasked0 : 0)
           | (half1.masked(i1) ? kMasked0 << 1 : 0) | (last ? kLast : 0);
  }
  __device__ void settle() {
    const int m0 = i0 < half0.tiles ? half0.start(i0) : INT_MAX;
    const int m1 = i1 < half1.tiles ? half1.start(i1) : INT_MAX;
    start = min(m0, m1);
    use0 = m0 == start;
    use1 = m1 == start;
  }
  __device__ void advance() {
    i0 += use0;
    i1 += use1;
    if (i0 == half0.tiles && i1 == half1.tiles) i0 = 0, i1 = 0, ++bh;
    if (++stage == STAGES) stage = 0, phase ^= 1;
    settle();
  }
};

// The producer thread's loop: for each position of the walk, once its stage is free again, the stage's StageInfo and
// `load(stage, walk, full)`, the TMA loads of `bytes` bytes counted on the stage's `full` barrier. `j0`: the stages the
// ring has filled before this walk (a persistent CTA's earlier work), where its stages and phases go on from; returns
// the count after it.
template <int STAGES, typename Sched, typename Load>
__device__ __forceinline__ uint32_t produce_walk(StageInfo* info, uint64_t* full, uint64_t* empty,
                                                 Walk<STAGES, Sched> w, uint32_t bytes, Load load, uint32_t j0 = 0) {
  int j = int(j0);
  if (j0 > 0) w.stage = j % STAGES, w.phase = uint32_t(j / STAGES) & 1;
  for (; !w.done(); ++j, w.advance()) {
    if (j >= STAGES) mbar_wait(&empty[w.stage], w.phase ^ 1);
    info[w.stage] = {w.start, w.flags(), w.bh};
    mbar_arrive_expect_tx(&full[w.stage], bytes);
    load(w.stage, w, &full[w.stage]);
  }
  return uint32_t(j);
}

// The key tiles of a CTA of 128 queries from start_cta (the forward, dQ), its two 64-query halves merged: a second
// half without queries (Triton launches no block for it) reads none.
template <int STAGES>
__device__ __forceinline__ Walk<STAGES, KeySchedule> key_walk(int start_cta, int n, bool causal, int64_t bh) {
  KeySchedule second(start_cta + kBlockM, n, causal);
  if (start_cta + kBlockM >= n) second.tiles = 0;
  return Walk<STAGES, KeySchedule>(KeySchedule(start_cta, n, causal), second, bh, 1);
}

// A CTA's 128-row block and head on a cta_grid (gridDim.x blocks of gridDim.y heads), taken in launch order from the
// last block to the first, the heads of each section of `section` interleaved block by block. The hardware starts
// CTAs in blockIdx order (x fastest), so: causal, a query-stationary kernel (the forward, the δ pass) starts its
// longest CTAs first, and the shortest end the grid (FA3's reversed m-blocks; with one head a section, each head's
// short CTAs would still be followed by the next head's long ones); a key-stationary one (dK/dV) starts its shortest
// first (FA3's SPT order, which the ordered dQ needs). A section's heads share L2 while their blocks run. Unsigned, as
// blockIdx is: the dK/dV consumers' index arithmetic compiles as it did from blockIdx (signed ints cost the unordered
// dK/dV kernels 8 bytes of stack and 2% of their time on the H200, session 14).
struct CtaTile {
  unsigned block, bh;
};
// (tile_from_last: the same for the `linear`-th tile of `blocks` x `heads`, for a persistent kernel's own order.)
__device__ __forceinline__ CtaTile tile_from_last(unsigned linear, unsigned blocks, unsigned heads, unsigned section) {
  const unsigned first = linear / (section * blocks) * section;  // the section's first head
  const unsigned size = min(section, heads - first), at = linear - first * blocks;
  return {blocks - 1 - at / size, first + at % size};
}
__device__ __forceinline__ CtaTile cta_from_last(unsigned section) {
  return tile_from_last(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, section);
}
// The query tile a CTA (or a persistent CTA's turn) runs: its first query, query head and kv head (GQA).
struct QueryTile {
  int start;
  int64_t bh, bh_kv;
};
template <typename Params>
__device__ __forceinline__ QueryTile query_tile(CtaTile t, const Params& p) {
  const int64_t bh = t.bh;
  return {int(t.block) * kCtaRows, bh, (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv)};
}
// Heads a section for the query-stationary kernels: a model of the launch (132 CTAs at a time, each CTA's time its key
// tiles) puts the causal grid's tail at 3.8% of its time at N = 8K, B·H = 64 in blockIdx order, 2.8% with each head
// reversed alone and 0.1% with sections of 2 to 8 heads; 4 heads' K̂ and V̂ at 8K are 8 MB of L2.
constexpr unsigned kQuerySectionHeads = 4;

// The CTA prologue of dQ and the δ pass, by thread 0: the stage barriers initialised (load_query_rows), and Q̂ and dÔ of
// the CTA's two 64-query halves loaded from row `row` of the (B·H·N_pad) codes, counted on rows_full
// (load_query_tiles: once per query tile of a persistent CTA). `s`: an Smem with full, empty, rows_full, q and dout
// (rows of D codes); the caller then syncs the CTA.
template <int D = kHeadDim, typename Smem>
__device__ __forceinline__ void load_query_tiles(Smem& s, const CUtensorMap* q, const CUtensorMap* dout, int row) {
  mbar_arrive_expect_tx(&s.rows_full, 2 * kCtaRows * D);
#pragma unroll
  for (int i = 0; i < kConsumers; ++i) {
    tma_load_2d(s.q[i], q, 0, row + kBlockM * i, &s.rows_full);
    tma_load_2d(s.dout[i], dout, 0, row + kBlockM * i, &s.rows_full);
  }
}
template <int STAGES, int D = kHeadDim, typename Smem>
__device__ __forceinline__ void load_query_rows(Smem& s, const CUtensorMap* q, const CUtensorMap* dout, int row) {
  init_stage_barriers<STAGES>(s.full, s.empty, &s.rows_full, kConsumers * kThreads / 32);
  load_query_tiles<D>(s, q, dout, row);
}

// A consumer's place in the ring of stages.
template <int STAGES>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  bool done = false;

  // The next tile half `half` reads, once its stage has filled (a stage it does not read is released on the way);
  // false after the CTA's last stage.
  __device__ bool take(const StageInfo* info, uint64_t* full, uint64_t* empty, int half, bool releaser, Tile& t) {
    bool use;
    while (next(info, full, half, t, use)) {
      if (use) return true;
      if (releaser) mbar_arrive(&empty[t.stage]);
    }
    return false;
  }

  // The next stage whether half `half` reads it (`use`) or not, once it has filled; false after the CTA's last stage.
  // The caller releases it.
  __device__ bool next(const StageInfo* info, uint64_t* full, int half, Tile& t, bool& use) {
    if (done) return false;
    mbar_wait(&full[stage], phase);
    const StageInfo here = info[stage];
    t = Tile{stage, phase, here.start, (here.flags & (kMasked0 << half)) != 0, here.bh};
    use = (here.flags & (kUse0 << half)) != 0;
    done = (here.flags & kLast) != 0;
    if (++stage == STAGES) stage = 0, phase ^= 1;
    return true;
  }
};

// Before a launch: the caller's device made current (the static runtime keeps its own) and the kernel allowed `smem`
// bytes of dynamic shared memory.
inline cudaError_t prepare_launch(const void* kernel, int smem, int device) {
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

// cuTensorMapEncodeTiled from the driver (the runtime is linked statically; the driver is whatever torch runs on).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                             &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p)
               : nullptr;
  }();
  return fn;
}


// A 2D map of e4m3 codes: `rows` rows of `row_bytes` bytes, boxes of box_rows x box_bytes in `swizzle`.
inline bool encode_codes(CUtensorMap* map, const void* base, uint64_t row_bytes, uint64_t rows, uint32_t box_bytes,
                  uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {row_bytes, rows}, strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_bytes, box_rows}, unit[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A (B, N, heads, D) tensor of 16-bit values (dK, dV) at element strides stride_b, stride_n, stride_h (D contiguous,
// each stride a multiple of 8 elements) for store_rows_tma<D>: boxes of 64 channels x 1 head x kOutBoxRows<D> rows x
// 1 batch, the 128-byte swizzle. False where the TMA cannot describe it (or no driver entry point).
template <int D = kHeadDim>
inline bool encode_out_rows(CUtensorMap* map, void* base, int b, int n, int heads, int64_t stride_b, int64_t stride_n,
                            int64_t stride_h) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (!encode || stride_b < 0 || stride_n < 0 || stride_h < 0) return false;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(heads), cuuint64_t(n), cuuint64_t(b)};
  const cuuint64_t strides[3] = {cuuint64_t(stride_h) * 2, cuuint64_t(stride_n) * 2, cuuint64_t(stride_b) * 2};
  const cuuint32_t box[4] = {64, 1, kOutBoxRows<D>, 1}, unit[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, base, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The shapes every launch over 128-row CTAs takes: 1 <= N <= N_pad, N_pad a whole number of CTAs, whole GQA groups.
template <typename Params>
inline bool valid_shape(const Params& p) {
  return p.n > 0 && p.h_kv > 0 && p.h % p.h_kv == 0 && p.n_pad % kCtaRows == 0 && p.n_pad >= p.n;
}

// Token-major codes (`rows` rows of D codes: Q̂, K̂, V̂, dÔ), boxes of `box_rows` rows, RowTile<D>'s swizzle (128
// bytes at D = 128, 64 at D = 64).
template <int D = kHeadDim>
inline bool encode_rows(CUtensorMap* map, const void* codes, uint64_t rows, uint32_t box_rows) {
  return encode_codes(map, codes, D, rows, D, box_rows, RowTileOf<D>::kMapSwizzle);
}

// Channel-major codes (`channels` rows of N_pad codes: V̂ᶜ, K̂ᶜ, Q̂'ᶜ, dÔᶜ), boxes of D channels x `box_tokens`,
// the 64-byte swizzle.
template <int D = kHeadDim>
inline bool encode_channels(CUtensorMap* map, const void* codes, uint64_t n_pad, uint64_t channels,
                            uint32_t box_tokens) {
  return encode_codes(map, codes, n_pad, channels, box_tokens, D, CU_TENSOR_MAP_SWIZZLE_64B);
}

// One CTA per 128 rows (queries or keys) of each of `heads` heads.
inline dim3 cta_grid(int n, int heads) { return dim3((n + kCtaRows - 1) / kCtaRows, heads); }

// A forward's launch (fwd_factored.cu, fwd_wide.cu: Maps holds q, k, vt) over 128-query CTAs: the device and shared
// memory prepared, Q̂ mapped in boxes of 64 rows, K̂ in boxes of `key_rows`, V̂ᶜᵀ in boxes of D channels x 64 keys.
// `extra`: the kernel's arguments after the maps.
template <int D = kHeadDim, typename Params, typename Maps, typename... Extra>
inline int launch_forward(void (*kernel)(const Params, const Maps, Extra...), int smem, uint32_t key_rows,
                          const Params& p, int device, cudaStream_t stream, Extra... extra) {
  if (cudaError_t err = prepare_launch(reinterpret_cast<const void*>(kernel), smem, device); err != cudaSuccess) {
    return err;
  }
  Maps maps;
  const uint64_t n_pad = p.n_pad, q_rows = uint64_t(p.b) * p.h * n_pad, kv_rows = uint64_t(p.b) * p.h_kv * n_pad;
  if (!encode_rows<D>(&maps.q, p.q8, q_rows, kBlockM) || !encode_rows<D>(&maps.k, p.k8, kv_rows, key_rows) ||
      !encode_channels<D>(&maps.vt, p.v8t, n_pad, uint64_t(p.b) * p.h_kv * D, kBlockN)) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  kernel<<<cta_grid(p.n, p.b * p.h), kCtaThreads, smem, stream>>>(p, maps, extra...);
  return cudaGetLastError();
}

// A δ pass's launch (delta_factored.cu, delta_wide.cu: Maps holds q, dout, k, v) over 128-query CTAs: the device and
// shared memory prepared, Q̂ and dÔ mapped in boxes of 64 rows, K̂ and V̂ in boxes of `key_rows`, rows of D codes.
// `grid`: the launch's if not empty, else cta_grid's; `extra`: the kernel's arguments after the maps.
template <int D = kHeadDim, typename Params, typename Maps, typename... Extra>
inline int launch_delta(void (*kernel)(const Params, const Maps, Extra...), int smem, uint32_t key_rows,
                        const Params& p, int device, cudaStream_t stream, dim3 grid = dim3(0), Extra... extra) {
  if (cudaError_t err = prepare_launch(reinterpret_cast<const void*>(kernel), smem, device); err != cudaSuccess) {
    return err;
  }
  Maps maps;
  const uint64_t n_pad = p.n_pad, q_rows = uint64_t(p.b) * p.h * n_pad, kv_rows = uint64_t(p.b) * p.h_kv * n_pad;
  if (!encode_rows<D>(&maps.q, p.q8, q_rows, kBlockM) || !encode_rows<D>(&maps.dout, p.do8, q_rows, kBlockM) ||
      !encode_rows<D>(&maps.k, p.k8, kv_rows, key_rows) || !encode_rows<D>(&maps.v, p.v8, kv_rows, key_rows)) {
    return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
  }
  kernel<<<grid.x ? grid : cta_grid(p.n, p.b * p.h), kCtaThreads, smem, stream>>>(p, maps, extra...);
  return cudaGetLastError();
}

}  // namespace factored
}  // namespace dm
