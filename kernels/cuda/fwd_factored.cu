// The forward of the factored scale layout (matched_factored, kernels/README.md) in one warp-specialised kernel,
// D = 128, causal or not, any GQA group: O and lse2 with the bits of Triton's factored forward
// (triton_fwd._attn_fwd_kernel, FACTORED, BLOCK_M = BLOCK_N = 64), on the structure of dq_factored.cu.
//
// One CTA per 128 queries and query head, three warpgroups:
//   - a producer warpgroup that gives its registers back (setmaxnreg 24); one thread loads Q̂ of the 128 queries
//     once, then per key tile K̂ (rows, 128-byte swizzle) and V̂ᶜᵀ (channel-major, 64-byte swizzle) into a ring of
//     STAGES stages;
//   - two consumer warpgroups (setmaxnreg 240), one per 64-query half, each Triton's launch for its 64 queries.
// Per key tile a consumer forms S = Q̂ K̂ᵀ (4 SS m64n64k32), then Triton's online softmax as its PTX has it: the row max
// of S·((s_q·s_k)·qk_scale) (masked tiles: −inf where a key is ≥ N or, causal, right of the query), m' = max(m, that),
// α = ex2(m − m'), P = ex2(fma(S, scale, −m')) (masked: ex2(S_masked − m')), l = fma(l, α, Σ P) with Σ summed in
// register order then across the quad (xor 2, xor 1); P̂ = e4m3(P·448) and O = fma(O, α, P̂ V̂ᶜ) (2 RS m64n128k32 over
// the tile's 64 keys into a zeroed partial: ACC_PROMOTE = 64, the default), or unpromoted O = O·α, then the wgmma
// accumulates into O. The epilogue writes (O · (s_Vᶜ[d] · (1/448))) / l (div.full) for queries < N and
// lse2 = m + log2(l) (libdevice's log2f as Triton's build of it runs) for every query of a half that Triton launches.
// Each half visits its key tiles in Triton's order (the unmasked ones, then the causal diagonal or the ragged end);
// the two orders merge (factored.cuh Walk): causal, the second half reads one key tile more than the first.
#include <cuda_runtime.h>

#include <cstdint>

#include "factored.cuh"
#include "fwd_factored.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

namespace dm {
namespace fwd {

using namespace factored;

constexpr uint32_t kTileBytes = 2 * kBlockN * kHeadDim;  // K̂, V̂ᶜᵀ
constexpr int kStages = 4;

template <int STAGES>
struct __align__(1024) Smem {
  uint8_t q[kConsumers][kBlockM * kHeadDim];
  uint8_t k[STAGES][kBlockN * kHeadDim];
  uint8_t vt[STAGES][kHeadDim * kBlockN];
  StageInfo info[STAGES];
  uint64_t full[STAGES], empty[STAGES], rows_full;
};
template <int STAGES>
constexpr int smem_bytes() { return int(sizeof(Smem<STAGES>)) + 1024; }  // + room to align the base

struct Maps {
  CUtensorMap q, k;  // rows of 128 codes, boxes of 64 rows, 128-byte swizzle
  CUtensorMap vt;    // V̂ᶜ channel-major, boxes of 128 channels x 64 keys, 64-byte swizzle
};

template <int STAGES>
__device__ __forceinline__ void produce(Smem<STAGES>& s, const Maps& maps, int64_t bh_kv, int n_pad,
                                        Walk<STAGES, KeySchedule> w) {
  const int64_t kv_rows = bh_kv * n_pad;
  produce_walk(s.info, s.full, s.empty, w, kTileBytes, [&](int st, const auto& at, uint64_t* full) {
    tma_load_2d(s.k[st], &maps.k, 0, int(kv_rows + at.start), full);
    tma_load_2d(s.vt[st], &maps.vt, at.start, int(bh_kv * kHeadDim), full);
  });
}

// libdevice's __nv_log2f as Triton's build of it compiles (its FTZ branch), instruction for instruction from the PTX of
// the factored forward: lse2's log2(l).
__device__ __forceinline__ float log2_libdevice_ftz(float x) {
  float y;
  asm("{\n"
      ".reg .pred tiny, finite, zero;\n"
      ".reg .f32 xs, e0, e, f, t, m;\n"
      ".reg .b32 bits, ie;\n"
      "setp.lt.f32 tiny, %1, 0f00800000;\n"
      "mul.f32 xs, %1, 0f4B000000;\n"
      "selp.f32 xs, xs, %1, tiny;\n"
      "selp.f32 e0, 0fC1B80000, 0f00000000, tiny;\n"
      "mov.b32 bits, xs;\n"
      "add.s32 ie, bits, -1060439283;\n"
      "and.b32 ie, ie, -8388608;\n"
      "sub.s32 bits, bits, ie;\n"
      "cvt.rn.f32.s32 e, ie;\n"
      "fma.rn.ftz.f32 e, e, 0f34000000, e0;\n"
      "mov.b32 m, bits;\n"
      "add.f32 f, m, 0fBF800000;\n"
      "fma.rn.ftz.f32 t, 0f3DC6B27F, f, 0fBE2C7F30;\n"
      "fma.rn.ftz.f32 t, t, f, 0f3E2FCF2A;\n"
      "fma.rn.ftz.f32 t, t, f, 0fBE374E43;\n"
      "fma.rn.ftz.f32 t, t, f, 0f3E520BF4;\n"
      "fma.rn.ftz.f32 t, t, f, 0fBE763C8B;\n"
      "fma.rn.ftz.f32 t, t, f, 0f3E93BF99;\n"
      "fma.rn.ftz.f32 t, t, f, 0fBEB8AA49;\n"
      "fma.rn.ftz.f32 t, t, f, 0f3EF6384A;\n"
      "fma.rn.ftz.f32 t, t, f, 0fBF38AA3B;\n"
      "mul.f32 t, f, t;\n"
      "mul.f32 t, f, t;\n"
      "fma.rn.ftz.f32 t, f, 0f3FB8AA3B, t;\n"
      "add.f32 %0, e, t;\n"
      "mov.b32 bits, xs;\n"
      "setp.lt.u32 finite, bits, 2139095040;\n"
      "@!finite fma.rn.ftz.f32 %0, xs, 0f7F800000, 0f7F800000;\n"
      "setp.eq.f32 zero, xs, 0f00000000;\n"
      "@zero mov.f32 %0, 0fFF800000;\n"
      "}\n"
      : "=f"(y)
      : "f"(x));
  return y;
}

// One key tile's online-softmax step for this thread's two query rows (`row[r]`): S (st) becomes P̂'s values before
// the cast, P · 448; m and l move on; returns α of each row in `alpha`.
__device__ __forceinline__ void softmax_tile(float (&st)[kBlockN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             const int (&row)[2], float row_scale, bool masked, int start_n, int n,
                                             bool causal) {
  const int q = threadIdx.x % 4;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2, key = start_n + 8 * i + 2 * q + v % 2;
      if (masked) {
        const bool visible = key < n && (!causal || key <= row[r]);
        const float s = visible ? __fmul_rn(row_scale, st[4 * i + v]) : -INFINITY;
        st[4 * i + v] = s;  // the masked loop exponentiates S·scale − m', not a fused multiply-add
        tile_max[r] = fmaxf(tile_max[r], s);
      } else {
        tile_max[r] = fmaxf(tile_max[r], st[4 * i + v]);  // the raw S: scaled once below
      }
    }
  }
  float m_new[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // unmasked, Triton's max of the scaled S is the scaled max of S: x -> fl(scale · x) is non-decreasing for a
    // scale > 0 (s_q, s_k, qk_scale are), so one multiply per row gives its bits, where 32 per tile did
    const float row_max = masked ? quad_max(tile_max[r]) : __fmul_rn(row_scale, quad_max(tile_max[r]));
    m_new[r] = fmaxf(m[r], row_max);
    alpha[r] = ex2_approx_ftz(__fsub_rn(m[r], m_new[r]));
    m[r] = m_new[r];
  }
  float sum[2];
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int r = v / 2;
      const float p = masked ? ex2_approx_ftz(__fsub_rn(st[4 * i + v], m_new[r]))
                             : ex2_approx_ftz(fmaf(row_scale, st[4 * i + v], -m_new[r]));
      sum[r] = i == 0 && v % 2 == 0 ? p : __fadd_rn(sum[r], p);  // in register order, as Triton's reduction
      st[4 * i + v] = __fmul_rn(p, 448.0f);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], quad_sum(sum[r]));
}

// The softmax step of `t` on its S (st, complete), then P̂'s A fragments.
__device__ __forceinline__ void softmax_fragments(float (&st)[kBlockN / 2], uint32_t (&frag)[kTileSteps][4],
                                                  float (&m)[2], float (&l)[2], float (&alpha)[2], const int (&row)[2],
                                                  float row_scale, const Tile& t, int n, bool causal) {
  if (t.masked) {  // two bodies: the unmasked one keeps no mask in registers
    softmax_tile(st, m, l, alpha, row, row_scale, true, t.start, n, causal);
  } else {
    softmax_tile(st, m, l, alpha, row, row_scale, false, t.start, n, causal);
  }
  to_fragments(st, frag);
}

// O · α then O += P̂ V̂ᶜ (unpromoted), or the product into `part` from zero (PROMOTE), one wgmma group.
template <bool PROMOTE>
__device__ __forceinline__ void issue_pv(float (&acc)[kHeadDim / 2], float (&part)[PROMOTE ? kHeadDim / 2 : 1],
                                         uint32_t (&frag)[kTileSteps][4], const float (&alpha)[2], const uint8_t* vt) {
  if constexpr (PROMOTE) {
    issue_channel_product<true>(acc, part, frag, vt);
  } else {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc[i] = __fmul_rn(acc[i], alpha[(i / 2) % 2]);
    issue_channel_product<false>(acc, acc, frag, vt);
  }
}

// After the PV group has completed: O = fma(O, α, P̂ V̂ᶜ) (PROMOTE), else O is the wgmma's.
template <bool PROMOTE>
__device__ __forceinline__ void finish_pv(float (&acc)[kHeadDim / 2], float (&part)[PROMOTE ? kHeadDim / 2 : 1],
                                          const float (&alpha)[2]) {
  if constexpr (PROMOTE) {
    fence_operands(part);
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc[i] = fmaf(acc[i], alpha[(i / 2) % 2], part[i]);
  } else {
    fence_operands(acc);
  }
}

// PIPELINED: S of the next tile is issued before P̂ V̂ᶜ of this one, and the next tile's softmax runs while that
// product is on the tensor cores (FlashAttention-3's intra-warpgroup overlap); otherwise each tile in turn. The same
// arithmetic in the same order either way.
// (FlashAttention-3's inter-warpgroup ping-pong, the two consumers taking turns to issue S, gained nothing on the H200
// and was removed: kernels/NOTES.md, session 11.)
template <bool PROMOTE, bool PIPELINED, int STAGES>
__device__ __forceinline__ void consume(Smem<STAGES>& s, const FwdFactoredParams& p, int half, int64_t bh,
                                        int64_t bh_kv, int start_m) {
  const bool releaser = threadIdx.x % 32 == 0;
  const auto [warp, g, q] = lane();
  const int row[2] = {start_m + 16 * warp + g, start_m + 16 * warp + g + 8};
  const float s_q = p.sq[bh * (p.n_pad / 128) + start_m / 128];
  const int64_t kv_scales = bh_kv * (p.n_pad / kBlockN);
  const uint8_t* q8 = s.q[half];
  Ring<STAGES> ring;
  float acc[kHeadDim / 2] = {};
  float part[PROMOTE ? kHeadDim / 2 : 1];  // one tile's P̂ V̂ᶜ (PROMOTE)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
  uint32_t frag[kTileSteps][4];
  mbar_wait(&s.rows_full, 0);
  const float* sk = p.sk + kv_scales;
  auto scale_of = [&](const Tile& t) { return __fmul_rn(__fmul_rn(s_q, sk[t.start / kBlockN]), p.qk_scale); };
  Tile t;
  // tile t in turn, once its S is issued: the softmax, P̂ V̂ᶜ, the stage released, O updated
  auto after_s = [&](float (&st)[kBlockN / 2]) {
    wgmma_wait<0>();
    fence_operands(st);
    softmax_fragments(st, frag, m, l, alpha, row, scale_of(t), t, p.n, p.causal);
    issue_pv<PROMOTE>(acc, part, frag, alpha, s.vt[t.stage]);
    wgmma_wait<0>();
    if (releaser) mbar_arrive(&s.empty[t.stage]);
    finish_pv<PROMOTE>(acc, part, alpha);
  };
  if constexpr (PIPELINED) {
    // every wgmma group in the loop body is issued and waited for unconditionally (a conditional issue makes ptxas
    // serialise them all): the first tile's S before the loop, the last tile's P̂ V̂ᶜ after it
    float st[kBlockN / 2];
    float next_alpha[2];
    if (ring.take(s.info, s.full, s.empty, half, releaser, t)) {
      issue_ss<kBlockN>(st, q8, s.k[t.stage]);
      wgmma_wait<0>();
      fence_operands(st);
      softmax_fragments(st, frag, m, l, alpha, row, scale_of(t), t, p.n, p.causal);
      Tile next;
#pragma unroll 1
      while (ring.take(s.info, s.full, s.empty, half, releaser, next)) {
        issue_ss<kBlockN>(st, q8, s.k[next.stage]);
        issue_pv<PROMOTE>(acc, part, frag, alpha, s.vt[t.stage]);
        wgmma_wait<1>();  // S of the next tile; this tile's P̂ V̂ᶜ may still run
        fence_operands(st);
        if (next.masked) {  // the next tile's softmax beside this tile's product; its fragments once that is done
          softmax_tile(st, m, l, next_alpha, row, scale_of(next), true, next.start, p.n, p.causal);
        } else {
          softmax_tile(st, m, l, next_alpha, row, scale_of(next), false, next.start, p.n, p.causal);
        }
        wgmma_wait<0>();
        if (releaser) mbar_arrive(&s.empty[t.stage]);
        finish_pv<PROMOTE>(acc, part, alpha);
        to_fragments(st, frag);  // P̂'s registers are free only now: the product read them until it completed
        alpha[0] = next_alpha[0], alpha[1] = next_alpha[1];
        t = next;
      }
      issue_pv<PROMOTE>(acc, part, frag, alpha, s.vt[t.stage]);
      wgmma_wait<0>();
      if (releaser) mbar_arrive(&s.empty[t.stage]);
      finish_pv<PROMOTE>(acc, part, alpha);
    }
  } else {
    while (ring.take(s.info, s.full, s.empty, half, releaser, t)) {
      float st[kBlockN / 2];
      issue_ss<kBlockN>(st, q8, s.k[t.stage]);
      after_s(st);
    }
  }
  const float* svc = p.svc + bh_kv * kHeadDim;
  const float inv448 = __int_as_float(0x3B124925);  // 1/448 in FP32, the constant of Triton's PTX
  store_rows(acc, [&](float x, int r, int col) { return div_full(__fmul_rn(x, __fmul_rn(svc[col], inv448)), l[r]); },
             p.o, p.out_fp16, p.stride_b, p.stride_n, p.stride_h, int(bh / p.h), int(bh % p.h), start_m, p.n);
  if (q == 0 && start_m < p.n) {  // every row of a half Triton launches, none of one it does not
#pragma unroll
    for (int r = 0; r < 2; ++r) p.lse2[bh * p.n_pad + row[r]] = __fadd_rn(m[r], log2_libdevice_ftz(l[r]));
  }
}

template <bool PROMOTE, bool PIPELINED, int STAGES>
__device__ __forceinline__ void fwd_block(uint8_t* raw, const FwdFactoredParams& p, const Maps& maps) {
  Smem<STAGES>& s = aligned_smem<Smem<STAGES>>(raw);
  if (threadIdx.x == 0) {
    init_stage_barriers<STAGES>(s.full, s.empty, &s.rows_full, kConsumers * kThreads / 32);
    const int row = int(int64_t(blockIdx.y) * p.n_pad + blockIdx.x * kCtaRows);
    mbar_arrive_expect_tx(&s.rows_full, kCtaRows * kHeadDim);
#pragma unroll
    for (int i = 0; i < kConsumers; ++i) tma_load_2d(s.q[i], &maps.q, 0, row + kBlockM * i, &s.rows_full);
  }
  __syncthreads();  // the barriers are initialised; no block-wide barrier after this point
  // what each role needs is computed after the register split: a value live across it would be spilled
  const int role = threadIdx.x / kThreads;  // 0: producer; 1, 2: the consumer of queries start + 64 (role − 1) ..
  const int start_m = blockIdx.x * kCtaRows;
  const int64_t bh = blockIdx.y, bh_kv = (bh / p.h) * p.h_kv + (bh % p.h) / (p.h / p.h_kv);
  if (role == 0) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) produce<STAGES>(s, maps, bh_kv, p.n_pad, key_walk<STAGES>(start_m, p.n, p.causal, bh));
    return;
  }
  claim_registers<kConsumerRegs>();
  // a second half without queries still runs: it takes no tile but releases every stage (Ring::take)
  consume<PROMOTE, PIPELINED, STAGES>(s, p, role - 1, bh, bh_kv, start_m + kBlockM * (role - 1));
}

}  // namespace fwd
}  // namespace dm

#define DM_FWD_KERNEL(NAME, PROMOTE, PIPELINED)                                                       \
  extern "C" __global__ void __launch_bounds__(dm::factored::kCtaThreads, 1)                           \
      NAME(const FwdFactoredParams p, const __grid_constant__ dm::fwd::Maps maps) {                    \
    extern __shared__ uint8_t smem[];                                                                \
    dm::fwd::fwd_block<PROMOTE, PIPELINED, dm::fwd::kStages>(smem, p, maps);                         \
  }
DM_FWD_KERNEL(dm_fwd_factored_ws4_promoted, true, false)
DM_FWD_KERNEL(dm_fwd_factored_ws4_unpromoted, false, false)
DM_FWD_KERNEL(dm_fwd_factored_ws4p_promoted, true, true)
DM_FWD_KERNEL(dm_fwd_factored_ws4p_unpromoted, false, true)
#undef DM_FWD_KERNEL

// variant: 0 each tile in turn (ws4), 1 the next tile's S and softmax beside this tile's P̂ V̂ᶜ (ws4p)
// (cuda_lib.FWD_VARIANTS)
extern "C" int dm_fwd_factored(const FwdFactoredParams* p, int promote, int variant, int device, cudaStream_t stream) {
  using namespace dm::factored;
  if (!valid_shape(*p) || variant < 0 || variant > 1) {
    return cudaErrorInvalidValue;
  }
  using Kernel = void (*)(const FwdFactoredParams, const dm::fwd::Maps);
  const Kernel kernels[2][2] = {{dm_fwd_factored_ws4_unpromoted, dm_fwd_factored_ws4_promoted},
                                {dm_fwd_factored_ws4p_unpromoted, dm_fwd_factored_ws4p_promoted}};
  return launch_forward(kernels[variant][promote ? 1 : 0], dm::fwd::smem_bytes<dm::fwd::kStages>(), kBlockN, *p, device,
                        stream);
}

// sizeof(FwdFactoredParams), for the loader's check that its ctypes mirror has the same layout.
extern "C" int dm_fwd_factored_params_size(void) { return static_cast<int>(sizeof(FwdFactoredParams)); }
