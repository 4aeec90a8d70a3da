// M2 of the CUDA backward (kernels/CUDA_BACKWARD.md section 5): dV alone in the factored scale layout
// (matched_factored, kernels/README.md), D = 128, causal or not, any GQA group.
//
// The Triton twin is the factored dV launch (triton_bwd._attn_bwd_dkdv_kernel with FACTORED, DO_DV only, BLOCK_M =
// BLOCK_N = 64). This kernel follows it operation for operation, so that on identical operands it is meant to give
// the same bits:
//   - one CTA (one warpgroup) per 64-key block and kv head; it loops over the group's query heads and, per head, over
//     the 64-query tiles in Triton's order (the unmasked tiles first, then the causal diagonal, then the ragged end);
//   - Sᵀ = K̂ Q̂ᵀ (64 keys x 64 queries, four SS m64n64k32), P = ex2.approx.ftz(fma(Sᵀ, (s_q * qk_scale) * s_k, -lse2)),
//     masked to 0 on the masked tiles, P̂ᵀ = e4m3(P * 448) (saturating: Triton's clamp) cast in registers and permuted
//     into A fragments (acc_to_a_fragment);
//   - dV += P̂ᵀ dÔᶜ (two RS m64n128k32 over the tile's 64 queries, B = the token-major dÔᶜᵀ codes). PROMOTE (Triton's
//     default, ACC_PROMOTE = 64): each tile's product starts from zero and is added into the FP32 dV, as Triton's
//     max_num_imprecise_acc = 64 does; otherwise the wgmma accumulates into dV itself over the whole loop;
//   - GQA: before each query head dV *= s_prev[d] / s_next[d] (div.full, Triton's `/`); after the loop
//     dV * (s_dOᶜ[d] * (1/448)) in the output dtype, keys < N only.
// Every FP32 multiply and add outside the one explicit FMA is written __fmul_rn / __fadd_rn (PTX mul.rn / add.rn),
// which ptxas never contracts into an FMA: Triton's PTX has none of them next to a contractible partner, so each is
// one IEEE rounding there too.
// Loads: cp.async into two shared-memory stages (the next tile's Q̂, dÔᶜᵀ and lse2 land while this one computes).
// No warp specialisation yet (M6): overlap comes from the 2-3 CTAs an SM holds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "dv_factored.cuh"
#include "factored.cuh"
#include "quant.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace dv {

using namespace factored;

using DoTile = KMajor64;  // dÔᶜᵀ [D, 64 queries] as the cp.async forms lay it out

struct __align__(1024) Smem {
  uint8_t k[kBlockN * kHeadDim];
  uint8_t q[2][kBlockM * kHeadDim];
  uint8_t dot[2][kHeadDim * kBlockM];
  float lse[2][kBlockM];
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}


// One query tile's operands into one shared-memory stage: Q̂ rows (128-byte swizzle), dÔᶜᵀ rows of 64 queries, lse2.
__device__ __forceinline__ void load_tile(uint8_t* q_dst, uint8_t* dot_dst, float* lse_dst, const DvFactoredParams& p,
                                          int64_t bh, int start_m) {
  const uint8_t* q = p.q8 + (bh * p.n_pad + start_m) * kHeadDim;
  const uint8_t* dot = p.do8t + bh * kHeadDim * p.n_pad + start_m;
  static_assert(kBlockM * kHeadDim / 16 % kThreads == 0, "whole 16-byte chunks per thread");
#pragma unroll
  for (int c = 0; c < kBlockM * kHeadDim / 16 / kThreads; ++c) {  // 4 chunks of Q̂ and 4 of dÔᶜᵀ per thread
    const int i = threadIdx.x + c * kThreads;
    cp_async16(q_dst + QTile::chunk_offset(i / (kHeadDim / 16), i % (kHeadDim / 16)), q + 16 * i);
    const int row = i / (kBlockM / 16), chunk = i % (kBlockM / 16);
    cp_async16(dot_dst + DoTile::chunk_offset(row, chunk), dot + int64_t(row) * p.n_pad + 16 * chunk);
  }
  if (threadIdx.x < kBlockM / 4) cp_async16(lse_dst + 4 * threadIdx.x, p.lse2 + bh * p.n_pad + start_m + 4 * threadIdx.x);
}

// K̂ (64 keys x D) into shared memory in the 128-byte swizzle.
__device__ __forceinline__ void load_k(uint8_t* k_dst, const DvFactoredParams& p, int bh_kv, int start_n) {
  const uint8_t* k = p.k8 + (int64_t(bh_kv) * p.n_pad + start_n) * kHeadDim;
#pragma unroll
  for (int c = 0; c < kBlockN * kHeadDim / 16 / kThreads; ++c) {
    const int i = threadIdx.x + c * kThreads;
    cp_async16(k_dst + QTile::chunk_offset(i / (kHeadDim / 16), i % (kHeadDim / 16)), k + 16 * i);
  }
}

// P = exp2(Sᵀ · row_scale − lse2), masked to 0 on a masked tile, then P · 448, in place in Sᵀ. Triton clamps P · 448
// to ±448 before its cast; cvt.rn.satfinite (to_fragments) saturates there itself, so the clamp is left out: the same
// codes for every finite P (a NaN stays NaN instead of becoming ±448).
__device__ __forceinline__ void softmax_tile(float (&st)[kBlockM / 2], const float* lse, float row_scale, bool masked,
                                             int start_n, int start_m, const DvFactoredParams& p) {
  const auto [warp, g, q] = lane();
#pragma unroll
  for (int i = 0; i < kBlockM / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int key = start_n + 16 * warp + g + 8 * (v / 2), col = 8 * i + 2 * q + (v % 2);
      float pv = ex2_approx_ftz(fmaf(st[4 * i + v], row_scale, -lse[col]));
      if (masked) {
        const int query = start_m + col;
        const bool visible = key < p.n && query < p.n && (!p.causal || query >= key);
        pv = visible ? pv : 0.0f;
      }
      st[4 * i + v] = __fmul_rn(pv, 448.0f);
    }
  }
}


// The epilogue: dV · (s_dOᶜ[d] / 448) of the last query head in the output dtype, keys < N.
__device__ __forceinline__ void store_dv(const float (&dv)[kHeadDim / 2], const float* sdoc, const DvFactoredParams& p,
                                         int b, int h_kv, int start_n) {
  store_rows(dv, [&](float x, int, int col) { return __fmul_rn(x, __fmul_rn(sdoc[col], 1.0f / 448.0f)); }, p.dv,
             p.out_fp16, p.stride_b, p.stride_n, p.stride_h, b, h_kv, start_n, p.n);
}


// The simple form: per tile, wait for its operands, Sᵀ, softmax, dV, each to completion (two cp.async stages).
template <bool PROMOTE>
__device__ __forceinline__ void dv_block(Smem& s, const DvFactoredParams& p) {
  const int start_n = blockIdx.x * kBlockN;
  const int bh_kv = blockIdx.y, b = bh_kv / p.h_kv, h_kv = bh_kv % p.h_kv;
  const int group = p.h / p.h_kv;
  const Schedule sched(start_n, p.n, p.causal);
  const int total = sched.tiles * group;
  auto head = [&](int j) { return int64_t(b) * p.h + int64_t(h_kv) * group + j / sched.tiles; };

  load_k(s.k, p, bh_kv, start_n);  // K̂ once, with the first tile (one cp.async group)
  if (total > 0) load_tile(s.q[0], s.dot[0], s.lse[0], p, head(0), sched.start(0));
  cp_async_commit();
  const float s_k = p.sk[int64_t(bh_kv) * (p.n_pad / kBlockN) + start_n / kBlockN];

  float dv[kHeadDim / 2] = {};  // [64 keys, D], accumulator order; in units of the current head's dÔᶜ scales

#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    const int it = j % sched.tiles, stage = j & 1;
    const int64_t bh = head(j);
    const int start_m = sched.start(it);
    if (j + 1 < total) {
      const int next = stage ^ 1;
      load_tile(s.q[next], s.dot[next], s.lse[next], p, head(j + 1), sched.start((j + 1) % sched.tiles));
    }
    cp_async_commit();
    const float s_q = p.sq[bh * (p.n_pad / 128) + start_m / 128];
    if (it == 0) rescale_channels(dv, j ? p.sdoc + (bh - 1) * kHeadDim : nullptr, p.sdoc + bh * kHeadDim);
    cp_async_wait<1>();
    fence_async_shared();
    __syncthreads();

    // Sᵀ = K̂ Q̂ᵀ: [64 keys, 64 queries]
    float st[kBlockM / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < QTile::kSteps; ++kk) {
      WgmmaE4M3<kBlockM>::ss(st, QTile::desc(s.k, kk), QTile::desc(s.q[stage], kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(st);

    softmax_tile(st, s.lse[stage], __fmul_rn(__fmul_rn(s_q, p.qk_scale), s_k), it >= sched.unmasked, start_n,
                 start_m, p);
    uint32_t frag[DoTile::kSteps][4];
    to_fragments(st, frag);

    // dV += P̂ᵀ dÔᶜ: [64 keys, D] over the tile's 64 queries
#pragma unroll
    for (int kk = 0; kk < DoTile::kSteps; ++kk) fence_operands(frag[kk]);
    if constexpr (PROMOTE) {
      float part[kHeadDim / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DoTile::kSteps; ++kk) {
        WgmmaE4M3<kHeadDim>::rs(part, frag[kk], DoTile::desc(s.dot[stage], kk), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(part);
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) dv[i] = __fadd_rn(dv[i], part[i]);
    } else {
      fence_operands(dv);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DoTile::kSteps; ++kk) {
        WgmmaE4M3<kHeadDim>::rs(dv, frag[kk], DoTile::desc(s.dot[stage], kk), 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dv);
    }
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }
  cp_async_wait<0>();
  if (total > 0) store_dv(dv, p.sdoc + head(total - 1) * kHeadDim, p, b, h_kv, start_n);
}

// The pipelined form (the same operations on the same operands in the same order, so the same bits), after FA3's
// intra-warpgroup overlap: per tile j, Sᵀ(j+1) and dV(j) are issued back to back; the softmax of tile j+1 runs on the
// CUDA cores while dV(j) runs on the tensor core. Nothing is in flight across the loop's back edge (ptxas serialises
// every wgmma of a kernel whose pipeline it cannot follow: a wgmma group pending across the back edge, with its
// accumulator read after a wait<1>, was enough, C7515).
//   - STAGES cp.async stages: the tile STAGES-2 ahead of the one whose Sᵀ is issued loads meanwhile;
//   - K_RS: K̂ lives in registers as Sᵀ's A fragments (16 registers), so Sᵀ reads only Q̂ from shared memory.
template <int STAGES>
struct __align__(1024) PipeSmem {
  uint8_t k[kBlockN * kHeadDim];
  uint8_t q[STAGES][kBlockM * kHeadDim];
  uint8_t dot[STAGES][kHeadDim * kBlockM];
  float lse[STAGES][kBlockM];
};
template <int STAGES>
constexpr int pipe_smem_bytes() { return int(sizeof(PipeSmem<STAGES>)) + 1024; }  // + room to align the base

template <bool K_RS>
__device__ __forceinline__ void issue_s(float (&st)[kBlockM / 2], const uint8_t* k, const uint32_t (&kfrag)[4][4],
                                        const uint8_t* q) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < QTile::kSteps; ++kk) {
    if constexpr (K_RS) {
      WgmmaE4M3<kBlockM>::rs(st, kfrag[kk], QTile::desc(q, kk), kk > 0);
    } else {
      WgmmaE4M3<kBlockM>::ss(st, QTile::desc(k, kk), QTile::desc(q, kk), kk > 0);
    }
  }
  wgmma_commit();
}

template <bool PROMOTE>
__device__ __forceinline__ void issue_dv(float (&dv)[kHeadDim / 2], float (&part)[kHeadDim / 2],
                                         uint32_t (&frag)[DoTile::kSteps][4], const uint8_t* dot) {
#pragma unroll
  for (int kk = 0; kk < DoTile::kSteps; ++kk) fence_operands(frag[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < DoTile::kSteps; ++kk) {
    if constexpr (PROMOTE) {
      WgmmaE4M3<kHeadDim>::rs(part, frag[kk], DoTile::desc(dot, kk), kk > 0);
    } else {
      WgmmaE4M3<kHeadDim>::rs(dv, frag[kk], DoTile::desc(dot, kk), 1);
    }
  }
  wgmma_commit();
}


template <bool PROMOTE, int STAGES, bool K_RS>
__device__ __forceinline__ void dv_block_pipelined(uint8_t* raw, const DvFactoredParams& p) {
  static_assert(STAGES >= 3, "tile j+1 must be resident while tile j+STAGES-1 loads into tile j-1's stage");
  PipeSmem<STAGES>& s = aligned_smem<PipeSmem<STAGES>>(raw);
  const int start_n = blockIdx.x * kBlockN;
  const int bh_kv = blockIdx.y, b = bh_kv / p.h_kv, h_kv = bh_kv % p.h_kv;
  const int group = p.h / p.h_kv;
  const Schedule sched(start_n, p.n, p.causal);
  const int total = sched.tiles * group;
  if (total == 0) return;
  const int64_t bh0 = int64_t(b) * p.h + int64_t(h_kv) * group;  // the group's first query head
  using Cursor = factored::Cursor<STAGES>;  // the phase is unused here

  Cursor ahead{0, 0, 0, 0, bh0};  // the next tile to load
  auto load = [&]() {  // tile `ahead` into its stage (nothing past the end); always one commit group
    if (ahead.j < total) {
      load_tile(s.q[ahead.stage], s.dot[ahead.stage], s.lse[ahead.stage], p, ahead.bh, sched.start(ahead.it));
    }
    cp_async_commit();
    ahead.advance(sched.tiles);
  };
  const float s_k = p.sk[int64_t(bh_kv) * (p.n_pad / kBlockN) + start_n / kBlockN];
  // Sᵀ of tile c → P·448 in `st`, masked (the cast saturates)
  auto softmax = [&](const Cursor& c, float (&st)[kBlockM / 2]) {
    const int start_m = sched.start(c.it);
    const float s_q = p.sq[c.bh * (p.n_pad / 128) + start_m / 128];
    softmax_tile(st, s.lse[c.stage], __fmul_rn(__fmul_rn(s_q, p.qk_scale), s_k), c.it >= sched.unmasked, start_n,
                 start_m, p);
  };

  load_k(s.k, p, bh_kv, start_n);
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) load();  // K̂ rides with tile 0
  cp_async_wait<STAGES - 2>();                   // K̂ and tile 0
  fence_async_shared();
  __syncthreads();

  uint32_t kfrag[4][4];
  if constexpr (K_RS) load_k_fragments(s.k, kfrag);

  float dv[kHeadDim / 2] = {};  // [64 keys, D], accumulator order; in units of the current head's dÔᶜ scales
  float part[kHeadDim / 2];     // one tile's product (PROMOTE)
  uint32_t frag[DoTile::kSteps][4];
  Cursor cur{0, 0, 0, 0, bh0};  // the tile whose P̂ᵀ is in `frag`
  {
    float st[kBlockM / 2];
    issue_s<K_RS>(st, s.k, kfrag, s.q[0]);
    wgmma_wait<0>();
    fence_operands(st);
    softmax(cur, st);
    to_fragments(st, frag);
  }
  rescale_channels(dv, nullptr, p.sdoc + bh0 * kHeadDim);

#pragma unroll 1
  while (cur.j + 1 < total) {
    cp_async_wait<STAGES - 3>();  // this thread's copies of the next tile have landed
    fence_async_shared();
    __syncthreads();              // everyone's have, and every warp is past the last dV: its stage refills
    load();
    Cursor next = cur;
    next.advance(sched.tiles);

    float st[kBlockM / 2];
    issue_s<K_RS>(st, s.k, kfrag, s.q[next.stage]);
    issue_dv<PROMOTE>(dv, part, frag, s.dot[cur.stage]);
    wgmma_wait<1>();  // Sᵀ(next); dV(cur) runs on
    fence_operands(st);
    softmax(next, st);
    wgmma_wait<0>();  // dV(cur)
    finish_acc<PROMOTE>(dv, part);
    if (next.it == 0) rescale_channels(dv, p.sdoc + cur.bh * kHeadDim, p.sdoc + next.bh * kHeadDim);  // a new query head
    to_fragments(st, frag);
    cur = next;
  }
  issue_dv<PROMOTE>(dv, part, frag, s.dot[cur.stage]);
  wgmma_wait<0>();
  finish_acc<PROMOTE>(dv, part);
  cp_async_wait<0>();
  store_dv(dv, p.sdoc + cur.bh * kHeadDim, p, b, h_kv, start_n);
}

// The TMA form: the pipelined loop with its loads issued by one thread through the bulk-copy engine (Triton's TMA
// loads do the same): Q̂ and K̂ in the 128-byte swizzle, dÔᶜᵀ in the 64-byte swizzle (KMajor64Swizzle64), lse2 by a
// plain bulk copy, all counted on the stage's `full` barrier; each warp releases a stage on its `empty` barrier once
// its dV product has read it. No cp.async address arithmetic in the loop and no block-wide barrier.
constexpr uint32_t kTileBytes = kBlockM * kHeadDim * 2 + kBlockM * sizeof(float);  // Q̂, dÔᶜᵀ, lse2

template <int STAGES>
struct __align__(1024) TmaSmem {
  uint8_t k[kBlockN * kHeadDim];
  uint8_t q[STAGES][kBlockM * kHeadDim];
  uint8_t dot[STAGES][kHeadDim * kBlockM];
  float lse[STAGES][kBlockM];
  uint64_t full[STAGES], empty[STAGES], k_full;
};
template <int STAGES>
constexpr int tma_smem_bytes() { return int(sizeof(TmaSmem<STAGES>)) + 1024; }  // + room to align the base

struct TmaMaps {
  CUtensorMap q, k, dot;  // Q̂ rows, K̂ rows (box 64 rows x 128 bytes), dÔᶜᵀ rows (box 128 channels x 64 queries)
};


template <bool PROMOTE, int STAGES>
__device__ __forceinline__ void dv_block_tma(uint8_t* raw, const DvFactoredParams& p, const TmaMaps& maps) {
  static_assert(STAGES >= 3, "tile j+1 must be resident while tile j+STAGES-1 loads into tile j-1's stage");
  TmaSmem<STAGES>& s = aligned_smem<TmaSmem<STAGES>>(raw);
  const int start_n = blockIdx.x * kBlockN;
  const int bh_kv = blockIdx.y, b = bh_kv / p.h_kv, h_kv = bh_kv % p.h_kv;
  const int group = p.h / p.h_kv;
  const Schedule sched(start_n, p.n, p.causal);
  const int total = sched.tiles * group;
  if (total == 0) return;
  const int64_t bh0 = int64_t(b) * p.h + int64_t(h_kv) * group;
  const bool issuer = threadIdx.x == 0;
  using Cursor = factored::Cursor<STAGES>;

  Cursor ahead{0, 0, 0, 0, bh0};  // the next tile to load
  auto load = [&]() {  // by the issuing thread: tile `ahead` into its stage once that stage's last reader is done
    if (issuer && ahead.j < total) {
      if (ahead.j >= STAGES) mbar_wait(&s.empty[ahead.stage], ahead.phase ^ 1);
      uint64_t* full = &s.full[ahead.stage];
      const int start_m = sched.start(ahead.it);
      mbar_arrive_expect_tx(full, kTileBytes);
      tma_load_2d(s.q[ahead.stage], &maps.q, 0, int(ahead.bh * p.n_pad + start_m), full);
      tma_load_2d(s.dot[ahead.stage], &maps.dot, start_m, int(ahead.bh * kHeadDim), full);
      bulk_load(s.lse[ahead.stage], p.lse2 + ahead.bh * p.n_pad + start_m, kBlockM * sizeof(float), full);
    }
    __syncwarp();
    ahead.advance(sched.tiles);
  };
  const float s_k = p.sk[int64_t(bh_kv) * (p.n_pad / kBlockN) + start_n / kBlockN];
  auto s_q_of = [&](const Cursor& c) { return p.sq[c.bh * (p.n_pad / 128) + sched.start(c.it) / 128]; };
  // Sᵀ of tile c → P·448 in `st`, masked; s_q is c's Q̂ scale, read ahead (a global load's latency)
  auto softmax = [&](const Cursor& c, float s_q, float (&st)[kBlockM / 2]) {
    softmax_tile(st, s.lse[c.stage], __fmul_rn(__fmul_rn(s_q, p.qk_scale), s_k), c.it >= sched.unmasked, start_n,
                 sched.start(c.it), p);
  };

  if (issuer) init_stage_barriers<STAGES>(s.full, s.empty, &s.k_full);
  __syncthreads();
  if (issuer) {
    mbar_arrive_expect_tx(&s.k_full, kBlockN * kHeadDim);
    tma_load_2d(s.k, &maps.k, 0, int(int64_t(bh_kv) * p.n_pad + start_n), &s.k_full);
  }
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) load();

  mbar_wait(&s.k_full, 0);
  uint32_t kfrag[4][4];  // K̂ as Sᵀ's A fragments
  load_k_fragments(s.k, kfrag);

  float dv[kHeadDim / 2] = {};  // [64 keys, D], accumulator order; in units of the current head's dÔᶜ scales
  float part[kHeadDim / 2];     // one tile's product (PROMOTE)
  uint32_t frag[kTileSteps][4];
  Cursor cur{0, 0, 0, 0, bh0};  // the tile whose P̂ᵀ is in `frag`
  {
    float st[kBlockM / 2];
    const float s_q = s_q_of(cur);
    mbar_wait(&s.full[0], 0);
    issue_s<true>(st, s.k, kfrag, s.q[0]);
    wgmma_wait<0>();
    fence_operands(st);
    softmax(cur, s_q, st);
    to_fragments(st, frag);
  }
  rescale_channels(dv, nullptr, p.sdoc + bh0 * kHeadDim);
  const bool releaser = threadIdx.x % 32 == 0;

#pragma unroll 1
  while (cur.j + 1 < total) {
    load();
    Cursor next = cur;
    next.advance(sched.tiles);
    const float s_q = s_q_of(next);
    mbar_wait(&s.full[next.stage], next.phase);

    float st[kBlockM / 2];
    issue_s<true>(st, s.k, kfrag, s.q[next.stage]);
    issue_channel_product<PROMOTE>(dv, part, frag, s.dot[cur.stage]);
    wgmma_wait<1>();  // Sᵀ(next); dV(cur) runs on
    fence_operands(st);
    softmax(next, s_q, st);
    wgmma_wait<0>();  // dV(cur): this warp is done with cur's stage
    if (releaser) mbar_arrive(&s.empty[cur.stage]);
    finish_acc<PROMOTE>(dv, part);
    if (next.it == 0) rescale_channels(dv, p.sdoc + cur.bh * kHeadDim, p.sdoc + next.bh * kHeadDim);  // a new query head
    to_fragments(st, frag);
    cur = next;
  }
  issue_channel_product<PROMOTE>(dv, part, frag, s.dot[cur.stage]);
  wgmma_wait<0>();
  finish_acc<PROMOTE>(dv, part);
  store_dv(dv, p.sdoc + cur.bh * kHeadDim, p, b, h_kv, start_n);
}

}  // namespace dv
}  // namespace dm

#define DM_DV_KERNEL(NAME, PROMOTE)                                                                  \
  extern "C" __global__ void __launch_bounds__(dm::dv::kThreads, 1) NAME(const DvFactoredParams p) {    \
    __shared__ dm::dv::Smem smem;                                                                    \
    dm::dv::dv_block<PROMOTE>(smem, p);                                                              \
  }
DM_DV_KERNEL(dm_dv_factored_promoted, true)
DM_DV_KERNEL(dm_dv_factored_unpromoted, false)
#undef DM_DV_KERNEL

#define DM_DV_PIPE_KERNEL(NAME, PROMOTE, STAGES, K_RS)                                               \
  extern "C" __global__ void __launch_bounds__(dm::dv::kThreads, 1) NAME(const DvFactoredParams p) {    \
    extern __shared__ uint8_t smem[];                                                                \
    dm::dv::dv_block_pipelined<PROMOTE, STAGES, K_RS>(smem, p);                                      \
  }
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe3_ss_promoted, true, 3, false)
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe3_ss_unpromoted, false, 3, false)
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe3_rs_promoted, true, 3, true)
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe3_rs_unpromoted, false, 3, true)
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe5_rs_promoted, true, 5, true)
DM_DV_PIPE_KERNEL(dm_dv_factored_pipe5_rs_unpromoted, false, 5, true)
#undef DM_DV_PIPE_KERNEL

#define DM_DV_TMA_KERNEL(NAME, PROMOTE, STAGES, MIN_CTAS)                                             \
  extern "C" __global__ void __launch_bounds__(dm::dv::kThreads, MIN_CTAS)                              \
      NAME(const DvFactoredParams p, const __grid_constant__ dm::dv::TmaMaps maps) {                   \
    extern __shared__ uint8_t smem[];                                                                \
    dm::dv::dv_block_tma<PROMOTE, STAGES>(smem, p, maps);                                            \
  }
DM_DV_TMA_KERNEL(dm_dv_factored_tma3_promoted, true, 3, 1)
DM_DV_TMA_KERNEL(dm_dv_factored_tma3_unpromoted, false, 3, 1)
DM_DV_TMA_KERNEL(dm_dv_factored_tma4_promoted, true, 4, 1)
DM_DV_TMA_KERNEL(dm_dv_factored_tma4_unpromoted, false, 4, 1)
// three CTAs per SM (at most 168 registers): more warps to hide the wgmma and softmax latencies; unpromoted only (the
// promoted form's second accumulator would spill)
DM_DV_TMA_KERNEL(dm_dv_factored_tma3x3_unpromoted, false, 3, 3)
#undef DM_DV_TMA_KERNEL

namespace {

using dm::factored::encode_codes;
using DvKernel = void (*)(DvFactoredParams);
using DvTmaKernel = void (*)(DvFactoredParams, dm::dv::TmaMaps);




// The kernel of each (variant, promote) and the dynamic shared memory it needs; the variant numbers are
// cuda_lib.DV_VARIANTS' positions.
struct DvLaunch {
  DvKernel kernel;
  int smem;
};
DvLaunch dv_launch(int variant, bool promote) {
  using namespace dm::dv;
  switch (variant) {
    case 0: return {promote ? dm_dv_factored_promoted : dm_dv_factored_unpromoted, 0};
    case 1: return {promote ? dm_dv_factored_pipe3_ss_promoted : dm_dv_factored_pipe3_ss_unpromoted,
                    pipe_smem_bytes<3>()};
    case 2: return {promote ? dm_dv_factored_pipe3_rs_promoted : dm_dv_factored_pipe3_rs_unpromoted,
                    pipe_smem_bytes<3>()};
    case 3: return {promote ? dm_dv_factored_pipe5_rs_promoted : dm_dv_factored_pipe5_rs_unpromoted,
                    pipe_smem_bytes<5>()};
    default: return {nullptr, 0};
  }
}

// The TMA variants (DV_VARIANTS from position 4 on: tma3, tma4, tma3x3).
struct DvTmaLaunch {
  DvTmaKernel kernel;
  int smem;
};
DvTmaLaunch dv_tma_launch(int variant, bool promote) {
  using namespace dm::dv;
  switch (variant) {
    case 4: return {promote ? dm_dv_factored_tma3_promoted : dm_dv_factored_tma3_unpromoted, tma_smem_bytes<3>()};
    case 5: return {promote ? dm_dv_factored_tma4_promoted : dm_dv_factored_tma4_unpromoted, tma_smem_bytes<4>()};
    case 6: return {promote ? nullptr : dm_dv_factored_tma3x3_unpromoted, tma_smem_bytes<3>()};
    default: return {nullptr, 0};
  }
}

}  // namespace

extern "C" int dm_dv_factored(const DvFactoredParams* p, int promote, int variant, int device, cudaStream_t stream) {
  if (p->n <= 0 || p->h_kv <= 0 || p->h % p->h_kv || p->n_pad % 128 || p->n_pad < p->n) return cudaErrorInvalidValue;
  const DvLaunch launch = dv_launch(variant, promote != 0);
  const DvTmaLaunch tma = dv_tma_launch(variant, promote != 0);
  if (!launch.kernel && !tma.kernel) return cudaErrorInvalidValue;
  const void* kernel = launch.kernel ? reinterpret_cast<const void*>(launch.kernel)
                                     : reinterpret_cast<const void*>(tma.kernel);
  const int smem = launch.kernel ? launch.smem : tma.smem;
  if (cudaError_t err = dm::factored::prepare_launch(kernel, smem, device); err != cudaSuccess) return err;
  const dim3 grid((p->n + dm::dv::kBlockN - 1) / dm::dv::kBlockN, p->b * p->h_kv);
  if (launch.kernel) {
    launch.kernel<<<grid, dm::dv::kThreads, smem, stream>>>(*p);
  } else {
    using dm::dv::kBlockM, dm::dv::kBlockN, dm::dv::kHeadDim;
    dm::dv::TmaMaps maps;
    const uint64_t n_pad = p->n_pad;
    if (!encode_codes(&maps.q, p->q8, kHeadDim, uint64_t(p->b) * p->h * n_pad, kHeadDim, kBlockM,
                      CU_TENSOR_MAP_SWIZZLE_128B) ||
        !encode_codes(&maps.k, p->k8, kHeadDim, uint64_t(p->b) * p->h_kv * n_pad, kHeadDim, kBlockN,
                      CU_TENSOR_MAP_SWIZZLE_128B) ||
        !encode_codes(&maps.dot, p->do8t, n_pad, uint64_t(p->b) * p->h * kHeadDim, kBlockM, kHeadDim,
                      CU_TENSOR_MAP_SWIZZLE_64B)) {
      return cudaErrorInvalidValue;  // no driver entry point, or a layout the TMA cannot describe
    }
    tma.kernel<<<grid, dm::dv::kThreads, smem, stream>>>(*p, maps);
  }
  return cudaGetLastError();
}

// sizeof(DvFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_dv_factored_params_size(void) { return static_cast<int>(sizeof(DvFactoredParams)); }
