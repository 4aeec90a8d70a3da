// The factored forward (matched_factored, kernels/README.md) over 128-key tiles: FlashAttention-3's tile width for FP8
// where fwd_factored.cu keeps Triton's 64 keys and its bits. D = 128, causal or not, any GQA group. Not Triton's bits:
// the online softmax moves its max once per 128 keys and forms P · 448 by one fused multiply-add and an exponential
// (softmax_tile), and the PV product is promoted into FP32 once per tile (128 keys, DeepSeek-V3's interval) or not at
// all; the tests hold it to the reference simulation as tightly as Triton's kernels.
//
// One CTA per 128 queries and query head, three warpgroups:
//   - a producer warpgroup that gives its registers back (setmaxnreg 24); one thread loads Q̂ of the 128 queries once,
//     then per key tile K̂ (128 rows, 128-byte swizzle) and V̂ᶜᵀ (two boxes of D channels x 64 keys, 64-byte swizzle)
//     into a ring of kStages stages;
//   - two consumer warpgroups (setmaxnreg 240), one per 64-query half. Both read every tile: with 128-query CTAs and
//     128-key tiles the halves' schedules agree (the causal diagonal is one masked tile), so there is no walk to merge.
// Per key tile a consumer forms S = Q̂ K̂ᵀ (4 SS m64n128k32), the online softmax (a column's scale (s_q·s_k)·qk_scale,
// K̂'s scale per 64 keys; masked tiles: −inf where a key is ≥ N or, causal, right of the query), P̂ = e4m3(P·448) as A
// fragments without a shuffle (V̂ᶜ comes in triton_quant.fragment_token_order: the accumulator's bytes are the
// fragment's), and O = fma(O, α, P̂ V̂ᶜ) (4 RS m64n128k32 into a zeroed partial) or, unpromoted, O·α and the wgmma
// accumulates into O. PIPELINED: S of the next tile is issued before P̂ V̂ᶜ of this one and the next softmax runs
// beside that product (FlashAttention-3's intra-warpgroup overlap). PINGPONG (with PIPELINED): the two consumers take
// turns to issue their wgmma groups (named barriers 1 and 2, FlashAttention-3's inter-warpgroup schedule), so one
// half's softmax runs while the other's products hold the tensor cores: with FP8 at D = 128 a tile's exponentials
// (64 MUFU a thread, 8 cycles a warp each) take as long as its matmuls, and halves in step do both at once (on the
// H200 2% faster than w4p with the 7-instruction softmax, 4% slower with softmax_tile's 4.5: kernels/NOTES.md). The
// epilogue writes (O · s_Vᶜ[d]) / l (l sums P · 448) for queries < N and lse2 = m + log2(l) for every query of the CTA.
#include <cuda_runtime.h>

#include <cstdint>

#include "factored.cuh"
#include "fwd_factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace fwd_wide {

using namespace factored;

constexpr int kKeys = kWideKeys;            // keys per tile
constexpr int kSteps = kKeys / 32;          // k = 32 steps of P̂ V̂ᶜ over a tile
constexpr int kStages = 4;
template <int D>
constexpr uint32_t kTileBytes = 2 * kKeys * D;  // K̂, V̂ᶜᵀ

// Rows of D codes: D = 128 (every form), D = 64 (w4p and its emulating forms: dm_fwd_wide_d64).
template <int D>
struct __align__(1024) SmemOf {
  uint8_t q[kConsumers][kBlockM * D];
  uint8_t k[kStages][kKeys * D];
  uint8_t vt[kStages][2][D * kBlockN];  // two 64-key boxes of V̂ᶜᵀ
  uint64_t full[kStages], empty[kStages], rows_full;
};
template <int D>
constexpr int kSmemBytesOf = int(sizeof(SmemOf<D>)) + 1024;  // + room to align the base
constexpr int kSmemBytes = kSmemBytesOf<kHeadDim>;

struct Maps {
  CUtensorMap q;   // rows of D codes, boxes of 64 rows, RowTile<D>'s swizzle
  CUtensorMap k;   // the same, boxes of 128 rows
  CUtensorMap vt;  // V̂ᶜ channel-major, boxes of D channels x 64 keys, 64-byte swizzle
};

// One tile's online-softmax step for this thread's two rows: S (st, raw products) becomes P · 448; m and l move on;
// α of each row in `alpha`. `scale[h]`: the scale of columns 64h .. 64h + 63 (K̂'s two 64-key scale blocks), > 0.
// Four instructions an element and a half (FMNMX, FFMA, MUFU, FADD, half an F2FP): the row max is taken over the raw
// products of each 64-key half and scaled after (multiplying by a positive scale keeps the order, rounding included),
// and m is kept as the max less log2(448), so P · 448 = ex2(fma(s, scale, −m)) needs no multiply before the
// exponential or after it; l sums P · 448 and lse2 = m + log2(l) is unchanged in form (kernels/README.md). EMULATE > 0
// (w4pe8, w4pe4, w4pe2): chunk i's exponentials by ex2_poly<3> on the FMA pipe where i % EMULATE == EMULATE − 1, the
// rest MUFU, whose 64 results a thread and tile take as long as the tile's wgmmas (kernels/NOTES.md, session 28).
template <bool MASKED, int EMULATE>
__device__ __forceinline__ void softmax_tile(float (&st)[kKeys / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             const int (&row)[2], const float (&scale)[2], int start_n, int n,
                                             bool causal) {
  const int q = threadIdx.x % 4;
  float raw_max[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};  // [row][64-key half]
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2;
      if constexpr (MASKED) {
        const int key = start_n + 8 * i + 2 * q + v % 2;
        if (!(key < n && (!causal || key <= row[r]))) st[4 * i + v] = -INFINITY;
      }
      raw_max[r][i / 8] = fmaxf(raw_max[r][i / 8], st[4 * i + v]);
    }
  }
  float m_new[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float tile_max = fmaxf(__fmul_rn(scale[0], raw_max[r][0]), __fmul_rn(scale[1], raw_max[r][1]));
    // finite: every row sees a key of its first tile
    m_new[r] = fmaxf(m[r], __fsub_rn(quad_max(tile_max), kLog2Of448));
    alpha[r] = ex2_approx_ftz(__fsub_rn(m[r], m_new[r]));
    m[r] = m_new[r];
  }
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float x = fmaf(st[4 * i + v], scale[i / 8], -m_new[v / 2]);
      const float p = ex2_of_chunk<EMULATE, 3>(i, x);
      sum[v / 2] = __fadd_rn(sum[v / 2], p);
      st[4 * i + v] = p;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], quad_sum(sum[r]));
}

// e4m3(st) as the A fragments of P̂ V̂ᶜ over the tile's 128 keys: with V̂ᶜ's keys in fragment_token_order, lane q's
// four accumulator bytes of a 16-column group are its fragment's k = 4q .. 4q + 3 as they stand.
__device__ __forceinline__ void to_fragments(const float (&st)[kKeys / 2], uint32_t (&frag)[kSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int v0 = 8 * (2 * kk + r / 2) + 2 * (r % 2);
      frag[kk][r] = cvt_e4m3x4(st[v0], st[v0 + 1], st[v0 + 4], st[v0 + 5]);
    }
  }
}

// P̂ V̂ᶜ over the tile's 128 keys (4 RS m64n128k32), one wgmma group: into `part` from zero (PROMOTE), or after O · α
// into O itself.
template <bool PROMOTE, int D = kHeadDim>
__device__ __forceinline__ void issue_pv(float (&acc)[D / 2], float (&part)[PROMOTE ? D / 2 : 1],
                                         uint32_t (&frag)[kSteps][4], const float (&alpha)[2],
                                         const uint8_t (&vt)[2][D * kBlockN]) {
  if constexpr (!PROMOTE) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = __fmul_rn(acc[i], alpha[(i / 2) % 2]);
  }
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) fence_operands(frag[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint64_t desc = ChannelTile::desc(vt[kk / 2], kk % 2);
    if constexpr (PROMOTE) {
      WgmmaE4M3<D>::rs(part, frag[kk], desc, kk > 0);
    } else {
      WgmmaE4M3<D>::rs(acc, frag[kk], desc, 1);
    }
  }
  wgmma_commit();
}

template <bool PROMOTE, int D = kHeadDim>
__device__ __forceinline__ void finish_pv(float (&acc)[D / 2], float (&part)[PROMOTE ? D / 2 : 1],
                                          const float (&alpha)[2]) {
  if constexpr (PROMOTE) {
    fence_operands(part);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = fmaf(acc[i], alpha[(i / 2) % 2], part[i]);
  } else {
    fence_operands(acc);
  }
}

template <bool PROMOTE, bool PIPELINED, bool PINGPONG, bool OFFSET = false, int EMULATE = 0, int D = kHeadDim>
__device__ __forceinline__ void consume(SmemOf<D>& s, const FwdFactoredParams& p, int half, int64_t bh,
                                        int64_t bh_kv, int start_cta, float* row_max) {
  const bool releaser = threadIdx.x % 32 == 0;
  const auto [warp, g, q] = lane();
  const int start_m = start_cta + kBlockM * half;
  const int row[2] = {start_m + 16 * warp + g, start_m + 16 * warp + g + 8};
  const float s_q = p.sq[bh * (p.n_pad / 128) + start_cta / 128];
  const float* sk = p.sk + bh_kv * (p.n_pad / kBlockN);
  const WideTiles tiles(start_cta, p.n, p.causal, kCtaRows);
  const uint8_t* q8 = s.q[half];
  float acc[D / 2] = {};
  float part[PROMOTE ? D / 2 : 1];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
  float st[kKeys / 2];
  uint32_t frag[kSteps][4];
  // K̂'s scales of tile j, formed once its S is issued; loaded a tile ahead (a load once S was issued still came
  // before the S wait's end, an L2 round trip longer than S's four wgmmas); called once a tile, in order
  float ahead[2] = {sk[0], sk[1]};
  auto scales = [&](int j, float (&c)[2]) {
    c[0] = __fmul_rn(__fmul_rn(s_q, ahead[0]), p.qk_scale);
    c[1] = __fmul_rn(__fmul_rn(s_q, ahead[1]), p.qk_scale);
    const int next = 2 * min(j + 1, tiles.tiles - 1);
    ahead[0] = sk[next], ahead[1] = sk[next + 1];
  };
  auto softmax = [&](int j, const float (&c)[2], float (&a)[2]) {
    if (j < tiles.unmasked) {
      softmax_tile<false, EMULATE>(st, m, l, a, row, c, kKeys * j, p.n, p.causal);
    } else {
      softmax_tile<true, EMULATE>(st, m, l, a, row, c, kKeys * j, p.n, p.causal);
    }
  };
  auto wait_full = [&](int j) { mbar_wait(&s.full[j % kStages], (j / kStages) & 1); };
  auto release = [&](int j) {
    if (releaser) mbar_arrive(&s.empty[j % kStages]);
  };
  // PINGPONG: every wgmma issue of a half between its turn_wait and turn_give; the first half starts, and the second
  // gives no turn after its last issue, so each barrier completes as often as it is waited on
  auto turn = [&](auto&& issue, bool last) {
    if constexpr (PINGPONG) turn_wait(half);
    issue();
    if constexpr (PINGPONG) {
      if (!(last && half == 1)) turn_give(half);
    }
  };
  if constexpr (PINGPONG) {
    if (half == 1) turn_give(half);
  }
  mbar_wait(&s.rows_full, 0);
  if (tiles.tiles > 0) {
    // OFFSET: the second consumer starts once the first has formed its first tile's P (stagger_wait /
    // stagger_release): half a tile apart from then on, without PINGPONG's per-tile turns (tiles.tiles is the CTA's,
    // the same for both consumers, so both or neither reach these calls)
    if constexpr (OFFSET) stagger_wait(half);
    float c[2];
    wait_full(0);
    turn([&] { issue_ss<kKeys, D>(st, q8, s.k[0]); }, false);
    scales(0, c);
    wgmma_wait<0>();
    fence_operands(st);
    softmax(0, c, alpha);
    if constexpr (OFFSET) stagger_release(half);
    to_fragments(st, frag);
    if constexpr (PIPELINED) {
      // every wgmma group is issued and waited for unconditionally in the loop body (a conditional issue makes ptxas
      // serialise them all): the first tile's S before the loop, the last tile's P̂ V̂ᶜ after it
      float next_alpha[2];
#pragma unroll 1
      for (int j = 1; j < tiles.tiles; ++j) {
        wait_full(j);
        turn([&] {
          issue_ss<kKeys, D>(st, q8, s.k[j % kStages]);
          issue_pv<PROMOTE, D>(acc, part, frag, alpha, s.vt[(j - 1) % kStages]);
        }, false);
        scales(j, c);
        wgmma_wait<1>();  // S of tile j; the product of tile j − 1 may still run
        fence_operands(st);
        softmax(j, c, next_alpha);
        wgmma_wait<0>();
        release(j - 1);
        finish_pv<PROMOTE, D>(acc, part, alpha);
        to_fragments(st, frag);  // P̂'s registers are free only now: the product read them until it completed
        alpha[0] = next_alpha[0], alpha[1] = next_alpha[1];
      }
      turn([&] { issue_pv<PROMOTE, D>(acc, part, frag, alpha, s.vt[(tiles.tiles - 1) % kStages]); }, true);
      wgmma_wait<0>();
      release(tiles.tiles - 1);
      finish_pv<PROMOTE, D>(acc, part, alpha);
    } else {
#pragma unroll 1
      for (int j = 0;; ++j) {
        issue_pv<PROMOTE, D>(acc, part, frag, alpha, s.vt[j % kStages]);
        wgmma_wait<0>();
        release(j);
        finish_pv<PROMOTE, D>(acc, part, alpha);
        if (j + 1 == tiles.tiles) break;
        wait_full(j + 1);
        issue_ss<kKeys, D>(st, q8, s.k[(j + 1) % kStages]);
        scales(j + 1, c);
        wgmma_wait<0>();
        fence_operands(st);
        softmax(j + 1, c, alpha);
        to_fragments(st, frag);
      }
    }
  }
  const float* svc = p.svc + bh_kv * D;
  store_rows(acc, [&](float x, int r, int col) { return div_full(__fmul_rn(x, svc[col]), l[r]); },
             p.o, p.out_fp16, p.stride_b, p.stride_n, p.stride_h, int(bh / p.h), int(bh % p.h), start_m, p.n);
  if (q == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      p.lse2[bh * p.n_pad + row[r]] = __fadd_rn(m[r], log2f(l[r]));
      if (row_max != nullptr) store_f32(row_max + bh * p.n_pad + row[r], m[r]);  // the δ pass's p_max_bound reads it
    }
  }
}

template <bool PROMOTE, bool PIPELINED, bool PINGPONG, bool OFFSET = false, int EMULATE = 0, int D = kHeadDim>
__device__ __forceinline__ void fwd_block(uint8_t* raw, const FwdFactoredParams& p, const Maps& maps, float* row_max) {
  SmemOf<D>& s = aligned_smem<SmemOf<D>>(raw);
  const auto [start_cta, bh, bh_kv] = query_tile(cta_from_last(kQuerySectionHeads), p);  // causal: longest first
  if (threadIdx.x == 0) {
    init_stage_barriers<kStages>(s.full, s.empty, &s.rows_full, kConsumers * kThreads / 32);
    const int row = int(bh * p.n_pad + start_cta);
    mbar_arrive_expect_tx(&s.rows_full, kCtaRows * D);
#pragma unroll
    for (int i = 0; i < kConsumers; ++i) tma_load_2d(s.q[i], &maps.q, 0, row + kBlockM * i, &s.rows_full);
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      const WideTiles tiles(start_cta, p.n, p.causal, kCtaRows);
      const int kv_row = int(bh_kv * p.n_pad), channel_row = int(bh_kv * D);
      for (int j = 0; j < tiles.tiles; ++j) {
        const int st = j % kStages, start = kKeys * j;
        if (j >= kStages) mbar_wait(&s.empty[st], ((j / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&s.full[st], kTileBytes<D>);
        tma_load_2d(s.k[st], &maps.k, 0, kv_row + start, &s.full[st]);
        tma_load_2d(s.vt[st][0], &maps.vt, start, channel_row, &s.full[st]);
        tma_load_2d(s.vt[st][1], &maps.vt, start + kBlockN, channel_row, &s.full[st]);
      }
    }
    return;
  }
  claim_registers<kConsumerRegs>();
  consume<PROMOTE, PIPELINED, PINGPONG, OFFSET, EMULATE, D>(s, p, role - 1, bh, bh_kv, start_cta, row_max);
}

}  // namespace fwd_wide
}  // namespace dm

#define DM_FWD_WIDE_KERNEL(NAME, PROMOTE, PIPELINED, PINGPONG, OFFSET, EMULATE)                      \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                          \
      NAME(const FwdFactoredParams p, const __grid_constant__ dm::fwd_wide::Maps maps, float* row_max) { \
    extern __shared__ uint8_t smem[];                                                               \
    dm::fwd_wide::fwd_block<PROMOTE, PIPELINED, PINGPONG, OFFSET, EMULATE>(smem, p, maps, row_max); \
  }
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4_promoted, true, false, false, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4_unpromoted, false, false, false, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4p_promoted, true, true, false, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4p_unpromoted, false, true, false, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pp_promoted, true, true, true, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pp_unpromoted, false, true, true, false, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4po_promoted, true, true, false, true, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4po_unpromoted, false, true, false, true, 0)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe8_promoted, true, true, false, false, 8)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe8_unpromoted, false, true, false, false, 8)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe4_promoted, true, true, false, false, 4)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe4_unpromoted, false, true, false, false, 4)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe2_promoted, true, true, false, false, 2)
DM_FWD_WIDE_KERNEL(dm_fwd_wide_w4pe2_unpromoted, false, true, false, false, 2)
#undef DM_FWD_WIDE_KERNEL

// variant: 0 each tile in turn (w4), 1 the next tile's S and softmax beside this tile's P̂ V̂ᶜ (w4p), 2 w4p with the
// consumers taking turns to issue (w4pp), 3 w4p with the second consumer started half a tile late (w4po), 4, 5, 6 w4p
// with every 8th, 4th, 2nd 8-key chunk's exponentials emulated on the FMA pipe (w4pe8, w4pe4, w4pe2; ex2_poly<3>: not
// the other variants' bits) (cuda_lib.FWD_WIDE_VARIANTS). p->v8t in triton_quant.fragment_token_order. row_max: null,
// or (B, H, N_pad) FP32 that takes each row's m (the max of S·c less log2(448), as lse2 = m + log2(l) holds it), which
// the δ pass's DELTA_ROW_MAX variants read in place of their per-element max P (an argument of its own, not a field of
// FwdFactoredParams: kernels/NOTES.md, session 24, on a Params that grew).
extern "C" int dm_fwd_wide(const FwdFactoredParams* p, float* row_max, int promote, int variant, int device,
                           cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p) || variant < 0 || variant > 6) {
    return cudaErrorInvalidValue;
  }
  using Kernel = void (*)(const FwdFactoredParams, const dm::fwd_wide::Maps, float*);
  const Kernel kernels[7][2] = {{dm_fwd_wide_w4_unpromoted, dm_fwd_wide_w4_promoted},
                                {dm_fwd_wide_w4p_unpromoted, dm_fwd_wide_w4p_promoted},
                                {dm_fwd_wide_w4pp_unpromoted, dm_fwd_wide_w4pp_promoted},
                                {dm_fwd_wide_w4po_unpromoted, dm_fwd_wide_w4po_promoted},
                                {dm_fwd_wide_w4pe8_unpromoted, dm_fwd_wide_w4pe8_promoted},
                                {dm_fwd_wide_w4pe4_unpromoted, dm_fwd_wide_w4pe4_promoted},
                                {dm_fwd_wide_w4pe2_unpromoted, dm_fwd_wide_w4pe2_promoted}};
  return launch_forward(kernels[variant][promote ? 1 : 0], dm::fwd_wide::kSmemBytes, dm::fwd_wide::kKeys, *p, device,
                        stream, row_max);
}

// The forward at D = 64: w4p over rows of 64 codes (Q̂, K̂ in the 64-byte swizzle, two k = 32 steps of S; P̂ V̂ᶜ into
// 32 accumulators a thread by m64n64k32), the same softmax an element, and the forms of it that emulate a share of the
// exponentials (at D = 64 a tile's wgmmas take half as long as at D = 128, its MUFU exponentials as long). Operands
// and row_max as dm_fwd_wide's, D = 64.
#define DM_FWD_WIDE_D64_KERNEL(NAME, PROMOTE, EMULATE)                                                      \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                                 \
      NAME(const FwdFactoredParams p, const __grid_constant__ dm::fwd_wide::Maps maps, float* row_max) {     \
    extern __shared__ uint8_t smem[];                                                                      \
    dm::fwd_wide::fwd_block<PROMOTE, true, false, false, EMULATE, 64>(smem, p, maps, row_max);             \
  }
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4p_promoted_d64, true, 0)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4p_unpromoted_d64, false, 0)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe8_promoted_d64, true, 8)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe8_unpromoted_d64, false, 8)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe4_promoted_d64, true, 4)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe4_unpromoted_d64, false, 4)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe2_promoted_d64, true, 2)
DM_FWD_WIDE_D64_KERNEL(dm_fwd_wide_w4pe2_unpromoted_d64, false, 2)
#undef DM_FWD_WIDE_D64_KERNEL

// variant: dm_fwd_wide's numbering, of which 1 (w4p) and 4, 5, 6 (w4pe8, w4pe4, w4pe2) are built at D = 64
// (cuda_lib.FWD_WIDE_D64_VARIANTS).
extern "C" int dm_fwd_wide_d64(const FwdFactoredParams* p, float* row_max, int promote, int variant, int device,
                               cudaStream_t stream) {
  using namespace dm::factored;
  using Kernel = void (*)(const FwdFactoredParams, const dm::fwd_wide::Maps, float*);
  const Kernel kernels[7][2] = {{nullptr, nullptr},
                                {dm_fwd_wide_w4p_unpromoted_d64, dm_fwd_wide_w4p_promoted_d64},
                                {nullptr, nullptr},
                                {nullptr, nullptr},
                                {dm_fwd_wide_w4pe8_unpromoted_d64, dm_fwd_wide_w4pe8_promoted_d64},
                                {dm_fwd_wide_w4pe4_unpromoted_d64, dm_fwd_wide_w4pe4_promoted_d64},
                                {dm_fwd_wide_w4pe2_unpromoted_d64, dm_fwd_wide_w4pe2_promoted_d64}};
  if (!valid_shape(*p) || variant < 0 || variant > 6 || kernels[variant][0] == nullptr) {
    return cudaErrorInvalidValue;
  }
  return launch_forward<64>(kernels[variant][promote ? 1 : 0], dm::fwd_wide::kSmemBytesOf<64>, dm::fwd_wide::kKeys,
                            *p, device, stream, row_max);
}
