// Matched's δ pass with the factored layout's dŜ row scales (matched_factored) over 128-key tiles, D = 128, causal or
// not, any GQA group: what delta_factored.cu computes, in fwd_wide.cu's structure and fewer instructions an element.
//
// One CTA per 128 queries and query head: a producer warpgroup (setmaxnreg 24) whose one thread loads Q̂ and dÔ of the
// 128 queries once, then per key tile K̂ and V̂ (128 token-major rows each, 128-byte swizzle) into a ring of kStages
// stages; two consumer warpgroups (setmaxnreg 240), one per 64-query half, both reading every tile (with 128-query
// CTAs and 128-key tiles the masked range is the last tile alone: the causal diagonal or the ragged end).
// Per tile a consumer forms S = Q̂ K̂ᵀ and dÔ V̂ᵀ (4 + 4 SS m64n128k32) and, per element (six instructions):
//   P = ex2.approx.ftz(fma(S, (s_q·s_k)·qk_scale, −lse2)) (0 where masked), Triton's P bit for bit;
//   max P; t = P · (dÔ V̂ᵀ); Σ t and max |t| over each 64-key half, whose V̂ scale multiplies them once a tile.
// The sums and maxima stay in each thread across the tiles; the quad's four threads combine them once, at the end,
// where s_dO multiplies δ and max P·|dP̂|. The maxima are Triton's bits (a positive scale commutes with max, rounding
// included); δ differs from Triton's by FP32 summation order (Triton reduces each tile's row across the quad), and
// the row scales s = (fma(|δ|, max P, max P·|dP̂|) > 0 ? div.rn(·, 448) : 1) follow δ. Queries ≥ N take lse2 = +inf:
// their P is 0, δ 0 and s 1 (as Triton's masked rows).
// The forms (Form; kernels/NOTES.md has the H200's times, kPipelined the default):
//   kEachTile (w4): a tile's S and dÔ V̂ᵀ issued together, P formed while dÔ V̂ᵀ runs;
//   kPipelined (w4p): the next tile's S issued before this tile's arithmetic, this tile's dÔ V̂ᵀ right before it, so
//     the tensor cores hold work while the exponentials run (three 64-register tiles a thread: S twice, dÔ V̂ᵀ once);
//   kTurns (w4t): w4 with the consumers taking turns to issue (FlashAttention-3's ping-pong);
//   kOffset (w4po): w4p with the second consumer started once the first has formed its first tile's P: half a tile
//     behind from then on, with no per-tile turns (w4t's cost), if the stages do not bring them back into step. Both
//     consumers wait on the same `full` barriers and reach their exponentials together in w4p (ncu: tensor 46% and
//     XU 47% summing to ≈ 93%); this asked whether that lockstep, not the per-tile turns, is what w4t fixed and paid
//     for. No: w4po took 11% longer than w4p on the H200 (session 26), so the consumers in step are the better schedule;
//   w4pd (delta_persistent, below): w4p persistent, one CTA an SM taking query tiles from a counter (−1.2% at 8K).
// The five give the same bits. (The tile's two 64-key halves in turn, w4h, lost: kernels/NOTES.md, commit e280096.)
//   w4pe8, w4pe4, w4pe2 (EMULATE = 8, 4, 2): w4p with every EMULATE-th 8-key chunk's exponentials on the FMA pipe
//     (factored.cuh ex2_poly<5>), so MUFU, which takes as long as the tile's wgmmas, has 12.5, 25 or 50% less to do;
//     P within a few FP32 ulps of ex2.approx's (the dK/dV kernel's), so δ and s within FP32 round-off of w4p's.
#include <cuda_runtime.h>

#include <cstdint>

#include "delta_factored.cuh"
#include "factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace delta_wide {

using namespace factored;

constexpr int kKeys = kWideKeys;
constexpr int kStages = 4;
template <int D>
constexpr uint32_t kTileBytes = 2 * kKeys * D;  // K̂, V̂

// Rows of D codes: D = 128 (every form), D = 64 (w4p and its emulating and row-max forms: dm_delta_wide_d64).
template <int D>
struct __align__(1024) SmemOf {
  uint8_t q[kConsumers][kBlockM * D];
  uint8_t dout[kConsumers][kBlockM * D];
  uint8_t k[kStages][kKeys * D];
  uint8_t v[kStages][kKeys * D];
  uint64_t full[kStages], empty[kStages], rows_full;
  uint64_t rows_empty;  // w4pd: the consumers are done with q and dout (8 arrivals, one a consumer warp)
  int tile;             // w4pd: the query tile in q and dout (a linear index of tile_from_last), −1: none left
};
using Smem = SmemOf<kHeadDim>;
template <int D>
constexpr int kSmemBytesOf = int(sizeof(SmemOf<D>)) + 1024;  // + room to align the base
constexpr int kSmemBytes = kSmemBytesOf<kHeadDim>;

struct Maps {
  CUtensorMap q, dout;  // rows of D codes, boxes of 64 rows, RowTile<D>'s swizzle
  CUtensorMap k, v;     // the same, boxes of 128 rows
};

// This thread's two rows' running terms: δ and max P·|dP̂| before s_dO (V̂'s scale applied), max P per 64-key half.
struct Terms {
  float lse[2];
  float delta[2] = {0.0f, 0.0f}, pdp_max[2] = {0.0f, 0.0f};
  float p_max[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
};

// P of one tile in place of its raw S, and max P (unless ROW_MAX: its bound comes from the forward's row max).
// `scale[h]`: (s_q·s_k)·qk_scale of keys 64h .. 64h + 63. EMULATE > 0: chunk i's four elements by ex2_poly<5> where
// i % EMULATE == EMULATE − 1 (compile-time: i is unrolled).
template <bool MASKED, int EMULATE, bool ROW_MAX>
__device__ __forceinline__ void probabilities(float (&st)[kKeys / 2], Terms& t, const int (&row)[2],
                                              const float (&scale)[2], int start_n, int n, bool causal) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2, h = i / 8;
      const float x = fmaf(st[4 * i + v], scale[h], -t.lse[r]);
      float p = ex2_of_chunk<EMULATE, 5>(i, x);
      if constexpr (MASKED) {
        const int key = start_n + 8 * i + 2 * q + v % 2;
        if (!(key < n && (!causal || key <= row[r]))) p = 0.0f;
      }
      if constexpr (!ROW_MAX) t.p_max[r][h] = fmaxf(t.p_max[r][h], p);
      st[4 * i + v] = p;
    }
  }
}

// Σ P·(dÔ V̂ᵀ) and max |P·(dÔ V̂ᵀ)| over each 64-key half of the tile, times the half's V̂ scale, into the terms.
__device__ __forceinline__ void products(const float (&pt)[kKeys / 2], const float (&dpt)[kKeys / 2], Terms& t,
                                         const float (&s_v)[2]) {
  float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, most[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [row][half]
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2, h = i / 8;
      const float x = __fmul_rn(pt[4 * i + v], dpt[4 * i + v]);
      sum[r][h] = __fadd_rn(sum[r][h], x);
      most[r][h] = fmaxf(most[r][h], fabsf(x));
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      t.delta[r] = fmaf(sum[r][h], s_v[h], t.delta[r]);
      t.pdp_max[r] = fmaxf(t.pdp_max[r], __fmul_rn(most[r][h], s_v[h]));
    }
  }
}

enum Form { kEachTile = 0, kPipelined = 1, kTurns = 2, kOffset = 3 };

// One query tile's δ, s and 1/s. j0: how many key tiles the CTA's ring has taken before this query tile (its stages
// and phases follow on); rows_parity: the parity of rows_full's phase to wait for, −1 if the caller has waited;
// rows_empty: where each consumer warp arrives once its last wgmma has read q and dout (w4pd), or null. ROW_MAX: max P
// bounded from the forward's row maxima `row_max` (p_max_bound), each tile's 64 FMNMX a thread dropped.
template <int FORM, int EMULATE = 0, bool ROW_MAX = false, int D = kHeadDim>
__device__ __forceinline__ void consume(SmemOf<D>& s, const DeltaFactoredParams& p, int half, int64_t bh, int64_t bh_kv,
                                        int start_cta, int j0 = 0, int rows_parity = 0, uint64_t* rows_empty = nullptr,
                                        const float* row_max = nullptr) {
  const bool releaser = threadIdx.x % 32 == 0;
  const auto [warp, g, q] = lane();
  const int start_m = start_cta + kBlockM * half;
  const int row[2] = {start_m + 16 * warp + g, start_m + 16 * warp + g + 8};
  Terms t;
#pragma unroll
  for (int r = 0; r < 2; ++r) t.lse[r] = row[r] < p.n ? p.lse2[bh * p.n_pad + row[r]] : INFINITY;
  float m[2] = {0.0f, 0.0f};  // ROW_MAX: the forward's row maxima, loaded with lse2 (not at the end, after the loop)
  if constexpr (ROW_MAX) {
#pragma unroll
    for (int r = 0; r < 2; ++r) m[r] = row[r] < p.n ? row_max[bh * p.n_pad + row[r]] : 0.0f;
  }
  const int64_t scale_at = bh * (p.n_pad / 128) + start_cta / 128;
  const float s_q = p.sq[scale_at];
  const float* sk = p.sk + bh_kv * (p.n_pad / kBlockN);
  const float* sv = p.sv + bh_kv * (p.n_pad / kBlockN);
  const WideTiles tiles(start_cta, p.n, p.causal, kCtaRows);
  const uint8_t* q8 = s.q[half];
  const uint8_t* do8 = s.dout[half];
  auto stage = [&](int j) { return (j0 + j) % kStages; };
  auto wait_full = [&](int j) { mbar_wait(&s.full[stage(j)], ((j0 + j) / kStages) & 1); };
  auto release = [&](int j) {
    if (releaser) mbar_arrive(&s.empty[stage(j)]);
  };
  // K̂'s and V̂'s scales of a tile, loaded a tile ahead (a load in the tile that uses them came right before the
  // exponentials that need them: ncu's long-scoreboard stalls); called once a tile, in order
  float ahead[2][2];  // [K̂, V̂][64-key half] of the next tile to be scaled
  auto load_scales = [&](int j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) ahead[0][h] = sk[2 * j + h], ahead[1][h] = sv[2 * j + h];
  };
  load_scales(0);
  auto scales = [&](int j, float (&c)[2], float (&s_v)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      c[h] = __fmul_rn(__fmul_rn(s_q, ahead[0][h]), p.qk_scale);
      s_v[h] = ahead[1][h];
    }
    load_scales(min(j + 1, tiles.tiles - 1));
  };
  // P of tile j in `st` (its S complete), masked only where the tile is the masked one
  auto softmax = [&](float (&st)[kKeys / 2], int j, const float (&c)[2]) {
    if (j < tiles.unmasked) {
      probabilities<false, EMULATE, ROW_MAX>(st, t, row, c, kKeys * j, p.n, p.causal);
    } else {
      probabilities<true, EMULATE, ROW_MAX>(st, t, row, c, kKeys * j, p.n, p.causal);
    }
  };
  float dpt[kKeys / 2];
  // the rest of tile j once its S (in `st`) and dÔ V̂ᵀ are issued, the last wgmma groups: P while dÔ V̂ᵀ runs, then
  // the products
  auto finish = [&](float (&st)[kKeys / 2], int j) {
    float c[2], s_v[2];
    scales(j, c, s_v);
    wgmma_wait<1>();  // S; dÔ V̂ᵀ may still run beside the exponentials
    fence_operands(st);
    softmax(st, j, c);
    wgmma_wait<0>();
    fence_operands(dpt);
    release(j);
    products(st, dpt, t, s_v);
  };
  if (rows_parity >= 0) mbar_wait(&s.rows_full, rows_parity);
  if constexpr (FORM == kPipelined || FORM == kOffset) {
    // kOffset: the first consumer lets the second start after its first tile's P (stagger_wait / stagger_release)
    auto offset_start = [&](int j) {
      if constexpr (FORM == kOffset) {
        if (j == 0) stagger_release(half);
      }
    };
    if constexpr (FORM == kOffset) stagger_wait(half);
    float st_a[kKeys / 2], st_b[kKeys / 2];
    // tile j's S in `cur` (issued); issues dÔ V̂ᵀ of tile j and S of tile j + 1 into `next`, then tile j's arithmetic
    auto step = [&](float (&cur)[kKeys / 2], float (&next)[kKeys / 2], int j) {
      float c[2], s_v[2];
      issue_ss<kKeys, D>(dpt, do8, s.v[stage(j)]);
      wait_full(j + 1);
      issue_ss<kKeys, D>(next, q8, s.k[stage(j + 1)]);
      scales(j, c, s_v);
      wgmma_wait<2>();  // S of tile j
      fence_operands(cur);
      probabilities<false, EMULATE, ROW_MAX>(cur, t, row, c, kKeys * j, p.n, p.causal);  // only the last tile is masked
      offset_start(j);
      wgmma_wait<1>();  // dÔ V̂ᵀ of tile j; S of tile j + 1 may still run
      fence_operands(dpt);
      release(j);
      products(cur, dpt, t, s_v);
    };
    auto last = [&](float (&cur)[kKeys / 2], int j) {
      issue_ss<kKeys, D>(dpt, do8, s.v[stage(j)]);
      finish(cur, j);
      offset_start(j);  // a CTA of one key tile: after it (the second consumer must not wait for ever)
    };
    wait_full(0);
    issue_ss<kKeys, D>(st_a, q8, s.k[stage(0)]);
    int j = 0;
#pragma unroll 1
    while (true) {  // a tile count ≥ 1: every CTA sees a key
      if (j + 1 == tiles.tiles) {
        last(st_a, j);
        break;
      }
      step(st_a, st_b, j++);
      if (j + 1 == tiles.tiles) {
        last(st_b, j);
        break;
      }
      step(st_b, st_a, j++);
    }
  } else {  // each tile in turn; kTurns: the consumers take turns to issue (FlashAttention-3's ping-pong), so one's
            // exponentials run while the other's products hold the tensor cores. Both see every tile: each waits on
            // its barrier tiles.tiles times, and each is given as many turns (the second's first turn before the loop,
            // none after its last issue).
    float st[kKeys / 2];
    if constexpr (FORM == kTurns) {
      if (half == 1) turn_give(half);
    }
#pragma unroll 1
    for (int j = 0; j < tiles.tiles; ++j) {
      wait_full(j);
      if constexpr (FORM == kTurns) turn_wait(half);
      issue_ss<kKeys, D>(st, q8, s.k[stage(j)]);
      issue_ss<kKeys, D>(dpt, do8, s.v[stage(j)]);
      if constexpr (FORM == kTurns) {
        if (half == 0 || j + 1 < tiles.tiles) turn_give(half);
      }
      finish(st, j);
    }
  }
  if (rows_empty != nullptr && releaser) mbar_arrive(rows_empty);  // every wgmma of this query tile has completed
  const float s_do = p.sdo[scale_at];
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // every lane of the quad shuffles; its first writes
    const float delta = __fmul_rn(quad_sum(t.delta[r]), s_do);
    const float pdp_max = __fmul_rn(quad_max(t.pdp_max[r]), s_do);
    float p_max;
    if constexpr (ROW_MAX) {
      p_max = row[r] < p.n ? p_max_bound(m[r], t.lse[r]) : 0.0f;  // rows ≥ N: no P (lse2 = +inf)
    } else {
      p_max = quad_max(fmaxf(t.p_max[r][0], t.p_max[r][1]));
    }
    if (q == 0) {
      const int64_t at = bh * p.n_pad + row[r];
      const float bound = fmaf(fabsf(delta), p_max, pdp_max);
      const float scale = bound > 0.0f ? __fdiv_rn(bound, 448.0f) : 1.0f;
      p.delta[at] = delta;
      p.rs[at] = scale;
      p.irs[at] = div_full(1.0f, scale);  // Triton's `1.0 / s`
    }
  }
}

template <int FORM, int EMULATE = 0, bool ROW_MAX = false, int D = kHeadDim>
__device__ __forceinline__ void delta_block(uint8_t* raw, const DeltaFactoredParams& p, const Maps& maps,
                                            const float* row_max = nullptr) {
  SmemOf<D>& s = aligned_smem<SmemOf<D>>(raw);
  const auto [start_cta, bh, bh_kv] = query_tile(cta_from_last(kQuerySectionHeads), p);  // causal: longest first
  if (threadIdx.x == 0) load_query_rows<kStages, D>(s, &maps.q, &maps.dout, int(bh * p.n_pad + start_cta));
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      const WideTiles tiles(start_cta, p.n, p.causal, kCtaRows);
      const int kv_row = int(bh_kv * p.n_pad);
      for (int j = 0; j < tiles.tiles; ++j) {
        const int st = j % kStages;
        if (j >= kStages) mbar_wait(&s.empty[st], ((j / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&s.full[st], kTileBytes<D>);
        tma_load_2d(s.k[st], &maps.k, 0, kv_row + kKeys * j, &s.full[st]);
        tma_load_2d(s.v[st], &maps.v, 0, kv_row + kKeys * j, &s.full[st]);
      }
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  consume<FORM, EMULATE, ROW_MAX, D>(s, p, role - 1, bh, bh_kv, start_cta, 0, 0, nullptr, row_max);
}

// w4pd: w4p persistent (FlashAttention-3's persistent tile scheduler). One CTA an SM; its producer thread takes query
// tiles (the linear index of tile_from_last, so the longest first, as the other forms' launch order) from `taken`
// (zeroed before the launch), each the next one free as it starts the last (an atomicAdd, its latency behind a whole
// tile), and for each: once the consumers are done with the last tile's q and dout (rows_empty), the tile's index
// into shared memory (s.tile), Q̂ and dÔ (rows_full), then its key tiles into the ring, whose stages and phases run on
// across the query tiles; past the last tile it sets s.tile = −1 and completes rows_full. The consumers wait on
// rows_full, read s.tile and run consume() on it. So a query tile's first loads overlap the last one's row terms, quad
// reductions and stores, and no CTA launch falls between query tiles.
__device__ __forceinline__ void delta_persistent(uint8_t* raw, const DeltaFactoredParams& p, const Maps& maps,
                                                 int* taken) {
  Smem& s = aligned_smem<Smem>(raw);
  const unsigned blocks = unsigned(p.n + kCtaRows - 1) / kCtaRows, heads = unsigned(p.b * p.h);
  const unsigned count = blocks * heads;
  auto tile = [&](unsigned linear) {
    return query_tile(tile_from_last(linear, blocks, heads, kQuerySectionHeads), p);
  };
  if (threadIdx.x == 0) {
    mbar_init(&s.rows_empty, kConsumers * kThreads / 32);
    init_stage_barriers<kStages>(s.full, s.empty, &s.rows_full, kConsumers * kThreads / 32);
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int j0 = 0, it = 0;
      for (unsigned linear = blockIdx.x; linear < count; ++it) {
        const unsigned next = unsigned(atomicAdd(taken, 1)) + gridDim.x;
        const auto [start_cta, bh, bh_kv] = tile(linear);
        if (it > 0) mbar_wait(&s.rows_empty, (it - 1) & 1);
        s.tile = int(linear);
        load_query_tiles(s, &maps.q, &maps.dout, int(bh * p.n_pad + start_cta));
        const WideTiles tiles(start_cta, p.n, p.causal, kCtaRows);
        const int kv_row = int(bh_kv * p.n_pad);
        for (int j = 0; j < tiles.tiles; ++j) {
          const int g = j0 + j, st = g % kStages;
          if (g >= kStages) mbar_wait(&s.empty[st], ((g / kStages) & 1) ^ 1);
          mbar_arrive_expect_tx(&s.full[st], kTileBytes<kHeadDim>);
          tma_load_2d(s.k[st], &maps.k, 0, kv_row + kKeys * j, &s.full[st]);
          tma_load_2d(s.v[st], &maps.v, 0, kv_row + kKeys * j, &s.full[st]);
        }
        j0 += tiles.tiles;
        linear = next;
      }
      if (it > 0) mbar_wait(&s.rows_empty, (it - 1) & 1);
      s.tile = -1;
      mbar_arrive(&s.rows_full);
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  int j0 = 0;
  for (int it = 0;; ++it) {
    mbar_wait(&s.rows_full, it & 1);
    const int linear = *reinterpret_cast<volatile int*>(&s.tile);
    if (linear < 0) break;
    const auto [start_cta, bh, bh_kv] = tile(unsigned(linear));
    consume<kPipelined>(s, p, role - 1, bh, bh_kv, start_cta, j0, -1, &s.rows_empty);
    j0 += WideTiles(start_cta, p.n, p.causal, kCtaRows).tiles;
  }
}

}  // namespace delta_wide
}  // namespace dm

#define DM_DELTA_WIDE_KERNEL(NAME, FORM, EMULATE)                                                      \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                          \
      NAME(const DeltaFactoredParams p, const __grid_constant__ dm::delta_wide::Maps maps) {          \
    extern __shared__ uint8_t smem[];                                                               \
    dm::delta_wide::delta_block<dm::delta_wide::FORM, EMULATE>(smem, p, maps);                      \
  }
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4, kEachTile, 0)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4p, kPipelined, 0)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4t, kTurns, 0)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4po, kOffset, 0)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4pe8, kPipelined, 8)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4pe4, kPipelined, 4)
DM_DELTA_WIDE_KERNEL(dm_delta_wide_w4pe2, kPipelined, 2)
#undef DM_DELTA_WIDE_KERNEL
// the same reading the forward's row maxima (ROW_MAX)
#define DM_DELTA_ROW_MAX_KERNEL(NAME, EMULATE)                                                                \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                                  \
      NAME(const DeltaFactoredParams p, const __grid_constant__ dm::delta_wide::Maps maps, const float* row_max) { \
    extern __shared__ uint8_t smem[];                                                                       \
    dm::delta_wide::delta_block<dm::delta_wide::kPipelined, EMULATE, true>(smem, p, maps, row_max);         \
  }
DM_DELTA_ROW_MAX_KERNEL(dm_delta_wide_w4pm, 0)
DM_DELTA_ROW_MAX_KERNEL(dm_delta_wide_w4pme8, 8)
DM_DELTA_ROW_MAX_KERNEL(dm_delta_wide_w4pme4, 4)
#undef DM_DELTA_ROW_MAX_KERNEL
extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)
    dm_delta_wide_w4pd(const DeltaFactoredParams p, const __grid_constant__ dm::delta_wide::Maps maps, int* taken) {
  extern __shared__ uint8_t smem[];
  dm::delta_wide::delta_persistent(smem, p, maps, taken);
}

// variant: 0 each tile in turn, dÔ V̂ᵀ beside the exponentials (w4), 1 the next tile's S issued before this tile's
// arithmetic too (w4p), 2 w4 with the consumers taking turns to issue (w4t), 3 w4p with the second consumer started
// half a tile late (w4po), 4 w4p persistent, one CTA an SM (w4pd; its count of tiles taken is an int allocated,
// zeroed and freed on the stream around the launch), 5, 6, 7 w4p with every 8th, 4th, 2nd 8-key chunk's exponentials
// emulated on the FMA pipe (w4pe8, w4pe4, w4pe2; ex2_poly<5>: P within a few FP32 ulps of ex2.approx's, so not the
// other variants' bits), 8, 9, 10 w4p, w4pe8, w4pe4 with max P bounded from the forward's row maxima `row_max`
// ((B, H, N_pad) FP32, dm_fwd_wide's; null for the others) in place of a max over each element (w4pm, w4pme8, w4pme4:
// δ the bits of the form without it, s a bound larger by ≈ 2^-20 (|m| + |y| + 16) relative, factored.cuh
// p_max_bound; cuda_lib.DELTA_ROW_MAX)
// (cuda_lib.DELTA_WIDE_VARIANTS). Operands as dm_delta_factored's.
extern "C" int dm_delta_wide(const DeltaFactoredParams* p, const float* row_max, int variant, int device,
                             cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p) || variant < 0 || variant > 10 || (variant >= 8) != (row_max != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (variant >= 8) {
    using Kernel = void (*)(const DeltaFactoredParams, const dm::delta_wide::Maps, const float*);
    const Kernel kernels[3] = {dm_delta_wide_w4pm, dm_delta_wide_w4pme8, dm_delta_wide_w4pme4};
    return launch_delta(kernels[variant - 8], dm::delta_wide::kSmemBytes, dm::delta_wide::kKeys, *p, device, stream,
                        dim3(0), row_max);
  }
  if (variant == 4) {
    int sms = 0;
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess) {
      return err;
    }
    const int64_t tiles = int64_t((p->n + kCtaRows - 1) / kCtaRows) * p->b * p->h;
    int* taken = nullptr;
    if (cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&taken), sizeof(int), stream); err != cudaSuccess) {
      return err;
    }
    int err = int(cudaMemsetAsync(taken, 0, sizeof(int), stream));
    if (err == cudaSuccess) {
      err = launch_delta(dm_delta_wide_w4pd, dm::delta_wide::kSmemBytes, dm::delta_wide::kKeys, *p, device, stream,
                         dim3(unsigned(tiles < sms ? tiles : sms)), taken);
    }
    const cudaError_t freed = cudaFreeAsync(taken, stream);
    return err != cudaSuccess ? err : freed;
  }
  using Kernel = void (*)(const DeltaFactoredParams, const dm::delta_wide::Maps);
  const Kernel kernels[8] = {dm_delta_wide_w4,    dm_delta_wide_w4p,   dm_delta_wide_w4t,   dm_delta_wide_w4po,
                             nullptr,             dm_delta_wide_w4pe8, dm_delta_wide_w4pe4, dm_delta_wide_w4pe2};
  return launch_delta(kernels[variant], dm::delta_wide::kSmemBytes, dm::delta_wide::kKeys, *p, device, stream);
}

// The δ pass at D = 64: w4p over rows of 64 codes (the 64-byte swizzle, two k = 32 steps a product), the same
// arithmetic an element (the exponentials, the products and the row terms do not depend on D), and the forms of it
// that emulate a share of the exponentials or read the forward's row maxima. At D = 64 a tile's wgmmas take half as
// long as at D = 128 while its 64 MUFU exponentials a thread do not, so MUFU bounds the loop.
#define DM_DELTA_WIDE_D64_KERNEL(NAME, EMULATE, ROW_MAX)                                                        \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                                    \
      NAME(const DeltaFactoredParams p, const __grid_constant__ dm::delta_wide::Maps maps, const float* row_max) { \
    extern __shared__ uint8_t smem[];                                                                         \
    dm::delta_wide::delta_block<dm::delta_wide::kPipelined, EMULATE, ROW_MAX, 64>(smem, p, maps, row_max);    \
  }
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4p_d64, 0, false)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pe8_d64, 8, false)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pe4_d64, 4, false)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pe2_d64, 2, false)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pm_d64, 0, true)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pme8_d64, 8, true)
DM_DELTA_WIDE_D64_KERNEL(dm_delta_wide_w4pme4_d64, 4, true)
#undef DM_DELTA_WIDE_D64_KERNEL

// variant: dm_delta_wide's numbering, of which 1 (w4p), 5, 6, 7 (w4pe8, w4pe4, w4pe2) and 8, 9, 10 (w4pm, w4pme8,
// w4pme4, reading `row_max`) are built at D = 64 (cuda_lib.DELTA_WIDE_D64_VARIANTS). Operands as dm_delta_factored's
// with D = 64.
extern "C" int dm_delta_wide_d64(const DeltaFactoredParams* p, const float* row_max, int variant, int device,
                                 cudaStream_t stream) {
  using namespace dm::factored;
  using Kernel = void (*)(const DeltaFactoredParams, const dm::delta_wide::Maps, const float*);
  const Kernel kernels[11] = {nullptr, dm_delta_wide_w4p_d64, nullptr, nullptr, nullptr,
                              dm_delta_wide_w4pe8_d64, dm_delta_wide_w4pe4_d64, dm_delta_wide_w4pe2_d64,
                              dm_delta_wide_w4pm_d64, dm_delta_wide_w4pme8_d64, dm_delta_wide_w4pme4_d64};
  if (!valid_shape(*p) || variant < 0 || variant > 10 || kernels[variant] == nullptr ||
      (variant >= 8) != (row_max != nullptr)) {
    return cudaErrorInvalidValue;
  }
  return launch_delta<64>(kernels[variant], dm::delta_wide::kSmemBytesOf<64>, dm::delta_wide::kKeys, *p, device,
                          stream, dim3(0), row_max);
}
