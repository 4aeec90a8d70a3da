// matched_factored's quantisation of Q, K, V and dO at D = 128: both copies of K, V and dO from two reads of each,
// where Triton's launches take three or four (kernels/NOTES.md, "quantisation from fewer reads": Triton's one-read
// program lost to its own layout conversions, so this is the CUDA form that row asked for), and Q's one copy.
//
//   dm_quant_stats: one CTA per stats_rows rows of a (batch, head) reads x once and writes per-channel partials plainly
//     (centred: Σx, max x, min x; else max |x|); the last CTA of the (batch, head) to finish (a ticket per (batch,
//     head)) folds them in block order, so the result is deterministic: mean = Σx / N and the per-channel scale
//     s_c = amax / 448 (1 where amax = 0), amax = max(fl(max x − mean), fl(mean − min x)) centred — which is
//     max |fl(x − mean)| bit for bit: x ↦ fl(x − mean) does not decrease and negation is exact — else max |x|.
//   dm_quant_dual: one CTA per scale block (64 rows for K and V, 128 for dO) reads x again and writes both casts:
//     token-major codes with the block's own scale (triton_quant._quant_pass_kernel's arithmetic: s = amax / 448,
//     code = e4m3(div.rn(x, s)) saturating) and channel-major codes with the channels' scales
//     (_per_channel_quant_pass_kernel's), the latter through shared memory, optionally in fragment_token_order;
//     with its channel argument 0 (dm_quant_block_128_*) the token-major cast alone (Q's 128-row blocks, no statistics).
//   dm_quant_stats_scaled / dm_quant_channel_scaled: Q'ᶜ, the dK product's operand in the backward: each row of x
//     multiplied by its row scale (Q' = s ⊙ Q, s the δ pass's dŜ row scales, an argument of its own), then the
//     per-channel max |x| and the channel-major cast alone (128-row CTAs, in fragment_token_order or not):
//     triton_quant.quantize_per_channel(x, row_scales=s, layouts="channel")'s two launches, bit for bit.
//
// Thread layout (both kernels, 256 threads): warp w holds channel chunks 4·(w % 4) .. +3 (8 channels = 16 bytes of
// BF16 each) of rows 8·(w / 4) .. +7 of a 16-row slab; lane l holds chunk 4·(w % 4) + l % 4 of row l / 4. A warp's
// load is 8 rows × 64 contiguous bytes. At D = 64 (the kernels ..._d64) a row is 8 chunks: warp w holds chunks
// 4·(w % 2) .. +3 of rows 8·(w / 2) .. +7 of a 32-row slab (Layout<D>), the rest the same. In the dual pass a lane's 8 channel codes go to shared memory as bytes at
// [channel][token], the token's 16-byte chunk XORed with the lane's l % 4: the warp's 32 byte stores then touch 8
// (natural order) or 16 (fragment order) distinct words in distinct banks, and the read-back of 16-token runs is
// conflict-free too (kernels/NOTES.md, the Versions row of this change, has the count).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "quant.cuh"

namespace dm::quant_passes {

constexpr int kHeadDim = 128;
constexpr int kThreads = 256;
// The thread layout at head dim D: a row's 16-byte chunks, the warps that cover a row, the 8-row groups a slab holds
// (one per such set of warps) and the slab's rows.
template <int D>
struct Layout {
  static_assert(D == 64 || D == 128, "the quantisation passes are built for D = 64 and 128");
  static constexpr int kChunks = D / 8, kRowWarps = kChunks / 4, kGroups = kThreads / 32 / kRowWarps;
  static constexpr int kSlab = 8 * kGroups;
};
constexpr int kStatsChunk = 128;  // rows a dm_quant_stats CTA loads at a time (8 per thread in flight)

struct Params {
  const void* x;  // (B, N, H, D) bf16 or fp16, D contiguous, rows 16-byte aligned
  int64_t stride_b, stride_n, stride_h;  // elements
  int b, h, n, n_pad, n_blocks;          // n_blocks: dm_quant_stats's CTAs per (batch, head), cdiv(n, rows a CTA)
  int block_rows, centre, fragment_order, in_fp16;
  float* part;      // (B·H, n_blocks, 3, D) partials
  int* tickets;     // (B·H), zero on entry to dm_quant_stats
  float* mean;      // (B, H, D), centre only
  float* scale_c;   // (B, H, D) per-channel scales
  uint8_t* x8;      // (B, H, N_pad, D) block-scaled codes
  float* sx;        // (B, H, N_pad / block_rows) their scales
  uint8_t* x8t;     // (B, H, D, N_pad) per-channel codes
};
// (The statistics' rows a CTA and the dual pass's channel flag are arguments of their own: 8 more bytes in this struct
// made ptxas build the dual pass with 32 more instructions of address arithmetic, and the H200 ran it 10% slower,
// session 24's call 7.)

struct Lane {
  int chunk;         // 16-byte chunk of the row (8 channels)
  int row_in_slab;   // 0..15
  int swizzle;       // lane % 4: the XOR of the shared-memory chunk index in the dual pass
};

template <int D = kHeadDim>
__device__ __forceinline__ Lane lane_of(int t) {
  constexpr int kRowWarps = Layout<D>::kRowWarps;
  const int warp = t / 32, lane = t % 32;
  return Lane{4 * (warp % kRowWarps) + lane % 4, 8 * (warp / kRowWarps) + lane / 4, lane % 4};
}

// A thread's view of x: its (batch, head)'s row 0 at its chunk.
__device__ __forceinline__ const uint16_t* row_base(const Params& p, int bh, int chunk) {
  const int b = bh / p.h, h = bh - b * p.h;
  return static_cast<const uint16_t*>(p.x) + b * p.stride_b + h * p.stride_h + 8 * chunk;
}

// Eight elements of row `row` in FP32 (FP16: the input is half precision, else BF16). A row >= n reads row 0 instead,
// so that a thread's loads issue back to back without a branch; ZERO then makes its values 0 (the casts), else they
// stay row 0's (the statistics, where a repeated row changes no maximum or minimum).
template <bool FP16, bool ZERO>
__device__ __forceinline__ void load8(const Params& p, const uint16_t* base, int row, float (&v)[8]) {
  const bool inside = row < p.n;
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(base + int64_t(inside ? row : 0) * p.stride_n));
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (FP16) {
      v[2 * i] = __half2float(__ushort_as_half(uint16_t(words[i] & 0xFFFF)));
      v[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(words[i] >> 16)));
    } else {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
    if (ZERO && !inside) v[2 * i] = v[2 * i + 1] = 0.0f;
  }
}

__device__ __forceinline__ float infinity() { return __int_as_float(0x7F800000); }

__device__ __forceinline__ float scale_from_amax(float amax) { return amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f; }

// Per-channel partials of one block of stats_rows rows, then (last CTA of the (batch, head)) their fold in block order.
// SCALED (max |x| only): of fl(x · rs[row]), rs the (B, H, N_pad) row scales; a row >= n counts as zero.
template <bool FP16, bool CENTRE, bool SCALED = false, int D = kHeadDim>
__device__ __forceinline__ void stats_block(const Params& p, int stats_rows, const float* rs = nullptr) {
  static_assert(!(CENTRE && SCALED), "the row-scaled statistics are max |x| only");
  using L = Layout<D>;
  __shared__ float partial[L::kGroups][3][D];  // [row group][sum, max, min][channel]
  __shared__ int last;
  const int t = threadIdx.x;
  const Lane ln = lane_of<D>(t);
  const int64_t bh = blockIdx.y;
  const int blk = blockIdx.x, row0 = blk * stats_rows, rows_end = min(row0 + stats_rows, p.n);
  const uint16_t* base = row_base(p, int(bh), ln.chunk);
  float sum[8], hi[8], lo[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) sum[i] = 0.0f, hi[i] = CENTRE ? -infinity() : 0.0f, lo[i] = infinity();
  for (int chunk0 = row0; chunk0 < rows_end; chunk0 += kStatsChunk) {
    float v[kStatsChunk / L::kSlab][8], r[kStatsChunk / L::kSlab];
#pragma unroll
    for (int s = 0; s < kStatsChunk / L::kSlab; ++s) {  // the chunk's loads first, all in flight
      const int row = chunk0 + L::kSlab * s + ln.row_in_slab;
      load8<FP16, false>(p, base, row, v[s]);  // a row >= n repeats row 0
      if (SCALED) r[s] = row < p.n ? __ldg(rs + bh * p.n_pad + row) : 0.0f;  // which zeroes the repeat
    }
#pragma unroll
    for (int s = 0; s < kStatsChunk / L::kSlab; ++s) {  // no maximum or minimum moves for a repeated row; the sum skips it
      const bool inside = chunk0 + L::kSlab * s + ln.row_in_slab < p.n;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (CENTRE) {
          sum[i] = __fadd_rn(sum[i], inside ? v[s][i] : 0.0f);
          hi[i] = fmaxf(hi[i], v[s][i]);
          lo[i] = fminf(lo[i], v[s][i]);
        } else {
          hi[i] = fmaxf(hi[i], fabsf(SCALED ? __fmul_rn(v[s][i], r[s]) : v[s][i]));
        }
      }
    }
  }
  // the 8 rows of a warp's row group: lanes l, l ^ 4, l ^ 8, l ^ 16 hold the same channels
#pragma unroll
  for (int m = 4; m < 32; m *= 2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      hi[i] = fmaxf(hi[i], __shfl_xor_sync(0xFFFFFFFFu, hi[i], m));
      if (CENTRE) {
        sum[i] = __fadd_rn(sum[i], __shfl_xor_sync(0xFFFFFFFFu, sum[i], m));
        lo[i] = fminf(lo[i], __shfl_xor_sync(0xFFFFFFFFu, lo[i], m));
      }
    }
  }
  if (t % 32 < 4) {
    const int group = (t / 32) / L::kRowWarps;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      partial[group][0][8 * ln.chunk + i] = sum[i];
      partial[group][1][8 * ln.chunk + i] = hi[i];
      partial[group][2][8 * ln.chunk + i] = lo[i];
    }
  }
  __syncthreads();
  float* part = p.part + (bh * p.n_blocks + blk) * 3 * D;
  if (t < D) {  // the row groups in order
    auto fold = [&](int c, auto op) {
      float y = op(partial[0][c][t], partial[1][c][t]);
#pragma unroll
      for (int g = 2; g < L::kGroups; ++g) y = op(y, partial[g][c][t]);
      return y;
    };
    part[t] = fold(0, [](float a, float b) { return __fadd_rn(a, b); });
    part[D + t] = fold(1, [](float a, float b) { return fmaxf(a, b); });
    part[2 * D + t] = fold(2, [](float a, float b) { return fminf(a, b); });
  }
  // the last CTA of this (batch, head) folds: its partials are visible to it once every CTA's release has happened
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(p.tickets + bh, 1) == p.n_blocks - 1;
  __syncthreads();
  if (!last || t >= D) return;
  __threadfence();
  const float* parts = p.part + bh * p.n_blocks * 3 * D;
  float total = 0.0f, top = CENTRE ? -infinity() : 0.0f, bottom = infinity();
  // block order, so the mean's bits do not depend on which CTA ran last; eight blocks' loads in flight at a time, where
  // a plain loop waits for each block's L2 round trip in turn (64 of them at 8K, at the end of the kernel)
  constexpr int kBatch = 8;
  for (int k0 = 0; k0 < p.n_blocks; k0 += kBatch) {
    float v[kBatch][3];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float* q = parts + int64_t(min(k0 + j, p.n_blocks - 1)) * 3 * D + t;
#pragma unroll
      for (int c = 0; c < 3; ++c) v[j][c] = __ldcg(q + c * D);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (k0 + j < p.n_blocks) {
        total = __fadd_rn(total, v[j][0]);
        top = fmaxf(top, v[j][1]);
        bottom = fminf(bottom, v[j][2]);
      }
    }
  }
  float amax = top;
  if (CENTRE) {
    const float mean = __fdiv_rn(total, float(p.n));
    p.mean[bh * D + t] = mean;
    amax = fmaxf(__fsub_rn(top, mean), __fsub_rn(mean, bottom));
  }
  p.scale_c[bh * D + t] = scale_from_amax(amax);
}

// Position of local token t (0..15 within its 16-group) in fragment_token_order: position 4q + j holds token
// 2q + (j & 1) + 8 (j >> 1), so token t sits at 4 ((t >> 1) & 3) + 2 (t >> 3) + (t & 1).
__device__ __forceinline__ int fragment_position(int t) { return 4 * ((t >> 1) & 3) + 2 * (t >> 3) + (t & 1); }
// Local row `row_in_slab` of slab s at position 16 · (its 16-group) in fragment order (D = 128: one 16-group a slab).
template <int D>
__device__ __forceinline__ int slab_position(int s, int row_in_slab) {
  constexpr int kSlab = Layout<D>::kSlab;
  if constexpr (kSlab == 16) {
    return 16 * s + fragment_position(row_in_slab);
  } else {
    return kSlab * s + (row_in_slab & ~15) + fragment_position(row_in_slab & 15);
  }
}

// RN(a / b) for many a and one b > 0, div.rn's bits in three instructions a quotient: y = rcp.approx(b) refined once,
// q = RN(a·y), t = RN(q·b − a) = −(a − q·b) (exact), q' = RN(q − y·t) — the fast path div.rn's own SASS takes
// (MUFU.RCP, five FFMA) wherever its FCHK lets it, which it does for b in [2^-60, 2^60] and normal a with
// |a / b| <= 448, the only quotients here (b = amax / 448 >= |a| / 448). The remainder is formed negated so that
// a = −0 gives −0 (q = −0, t = +0, q' = −0 − (+0)); div.rn's fast path, which forms a − q·b, would give +0 and leaves
// zeros to its slow path. Where |a / b| < 2^-11 the last bit may go to underflow, but every such value casts to a zero
// code of a's sign (E4M3's smallest step is 2^-9). A scale outside the range takes __fdiv_rn (FAST = false).
struct Divisor {
  float b, y;
};

__device__ __forceinline__ bool in_fast_range(float b) { return b >= 0x1p-60f && b <= 0x1p60f; }

__device__ __forceinline__ Divisor divisor(float b) {
  float y0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y0) : "f"(b));
  return Divisor{b, __fmaf_rn(y0, __fmaf_rn(y0, -b, 1.0f), y0)};
}

template <bool FAST>
__device__ __forceinline__ float quotient(float a, const Divisor& d) {
  if (!FAST) return __fdiv_rn(a, d.b);
  const float q = __fmul_rn(a, d.y);
  return __fmaf_rn(-d.y, __fmaf_rn(q, d.b, -a), q);
}

// The two casts of a thread's values: token-major codes to global memory (8 bytes a row), channel-major codes to the
// shared tile (a byte each, at the swizzled position of the header).
template <int ROWS, bool FRAGMENT, bool FAST, bool CHANNEL, bool TOKEN = true, int D = kHeadDim>
__device__ __forceinline__ void cast_block(const Params& p, const Lane& ln, int64_t bh, int row0,
                                           const float (&x)[ROWS / Layout<D>::kSlab][8], const Divisor& block,
                                           const Divisor (&channel)[8], uint8_t* tile) {
  constexpr int kSlab = Layout<D>::kSlab;
#pragma unroll
  for (int s = 0; s < ROWS / kSlab; ++s) {
    const int local = kSlab * s + ln.row_in_slab, row = row0 + local;
    if (TOKEN) {
      uint32_t packed[2];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        packed[w] = cvt_e4m3x4(quotient<FAST>(x[s][4 * w], block), quotient<FAST>(x[s][4 * w + 1], block),
                               quotient<FAST>(x[s][4 * w + 2], block), quotient<FAST>(x[s][4 * w + 3], block));
      }
      *reinterpret_cast<uint2*>(p.x8 + (bh * p.n_pad + row) * D + 8 * ln.chunk) =
          make_uint2(packed[0], packed[1]);
    }
    if (!CHANNEL) continue;
    const int pos = FRAGMENT ? slab_position<D>(s, ln.row_in_slab) : local;
    const int run = (pos >> 4) ^ ln.swizzle;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint16_t pair = cvt_e4m3x2(quotient<FAST>(x[s][2 * w], channel[2 * w]),
                                       quotient<FAST>(x[s][2 * w + 1], channel[2 * w + 1]));
      const int ch = 8 * ln.chunk + 2 * w;
      tile[ch * ROWS + 16 * run + (pos & 15)] = uint8_t(pair & 0xFF);
      tile[(ch + 1) * ROWS + 16 * run + (pos & 15)] = uint8_t(pair >> 8);
    }
  }
}

// A thread's rows of one scale block in FP32, centred (K), and their max |x|; TAIL (the block that holds row n − 1 and
// padding): rows >= n are zero.
// SCALED: each row times its row scale, rs_row[row] (the (batch, head)'s row of the (B, H, N_pad) scales).
template <int ROWS, bool FP16, bool CENTRE, bool TAIL, bool SCALED = false, int D = kHeadDim>
__device__ __forceinline__ float load_block(const Params& p, const uint16_t* base, int row0, const Lane& ln,
                                            const float (&mean)[8], float (&x)[ROWS / Layout<D>::kSlab][8],
                                            const float* rs_row = nullptr) {
  constexpr int kSlab = Layout<D>::kSlab;
  float amax = 0.0f;
#pragma unroll
  for (int s = 0; s < ROWS / kSlab; ++s) {
    const int row = row0 + kSlab * s + ln.row_in_slab;
    load8<FP16, TAIL>(p, base, row, x[s]);
    const float r = SCALED ? __ldg(rs_row + row) : 1.0f;  // row < n_pad: the scales' length
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (CENTRE) x[s][i] = TAIL && row >= p.n ? 0.0f : __fsub_rn(x[s][i], mean[i]);
      if (SCALED) x[s][i] = TAIL && row >= p.n ? 0.0f : __fmul_rn(x[s][i], r);
      amax = fmaxf(amax, fabsf(x[s][i]));
    }
  }
  return amax;
}

// One scale block: both casts of ROWS rows (CHANNEL false: the block-scaled token-major one alone, Q's; TOKEN false:
// the channel-major one alone, of the rows times their scales rs, Q'ᶜ's).
template <int ROWS, bool FP16, bool CENTRE, bool FRAGMENT, bool CHANNEL = true, bool TOKEN = true, int D = kHeadDim>
__device__ __forceinline__ void dual_block(const Params& p, const float* rs = nullptr) {
  static_assert(CHANNEL || TOKEN, "a cast to write");
  static_assert(TOKEN || !CENTRE, "the row-scaled channel cast is of uncentred rows");
  constexpr bool kScaled = !TOKEN;
  constexpr int kSlabs = ROWS / Layout<D>::kSlab, kRuns = ROWS / 16;  // the layout's slabs; 16-token runs per channel
  __shared__ __align__(16) uint8_t tile[CHANNEL ? D * ROWS : 16];  // channel-major codes, runs swizzled
  __shared__ float warp_max[kThreads / 32];
  const int t = threadIdx.x;
  const Lane ln = lane_of<D>(t);
  const int64_t bh = blockIdx.y;
  const int row0 = blockIdx.x * ROWS;
  const uint16_t* base = row_base(p, int(bh), ln.chunk);
  float x[kSlabs][8];
  float mean[8], sc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mean[i] = CENTRE ? p.mean[bh * D + 8 * ln.chunk + i] : 0.0f;
    sc[i] = CHANNEL ? p.scale_c[bh * D + 8 * ln.chunk + i] : 1.0f;
  }
  const float* rs_row = kScaled ? rs + bh * p.n_pad : nullptr;
  float amax = row0 + ROWS <= p.n
                   ? load_block<ROWS, FP16, CENTRE, false, kScaled, D>(p, base, row0, ln, mean, x, rs_row)
                   : load_block<ROWS, FP16, CENTRE, true, kScaled, D>(p, base, row0, ln, mean, x, rs_row);
  float sb = 1.0f;
  if (TOKEN) {
#pragma unroll
    for (int m = 1; m < 32; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
    if (t % 32 == 0) warp_max[t / 32] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);  // max is exact in any order
    sb = scale_from_amax(amax);
    if (t == 0) p.sx[bh * (p.n_pad / ROWS) + blockIdx.x] = sb;
  }
  Divisor channel[8];
  bool fast = in_fast_range(sb);
#pragma unroll
  for (int i = 0; i < 8; ++i) channel[i] = divisor(sc[i]), fast = fast && in_fast_range(sc[i]);
  if (fast) {  // every scale of this thread in range (all but absurd inputs): three instructions a quotient
    cast_block<ROWS, FRAGMENT, true, CHANNEL, TOKEN, D>(p, ln, bh, row0, x, divisor(sb), channel, tile);
  } else {
    cast_block<ROWS, FRAGMENT, false, CHANNEL, TOKEN, D>(p, ln, bh, row0, x, divisor(sb), channel, tile);
  }
  if (!CHANNEL) return;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < D * kRuns / kThreads; ++k) {
    const int idx = t + k * kThreads, ch = idx / kRuns, run = idx % kRuns;
    const int stored = run ^ ((ch >> 3) & 3);  // the writer's swizzle: its chunk (ch / 8) % 4 is its lane % 4
    const uint4 codes = *reinterpret_cast<const uint4*>(tile + ch * ROWS + 16 * stored);
    *reinterpret_cast<uint4*>(p.x8t + (bh * D + ch) * p.n_pad + row0 + 16 * run) = codes;
  }
}

}  // namespace dm::quant_passes

// Each kernel at D = 128 and, named ..._d64, at D = 64.
#define DM_QUANT_STATS_KERNEL(NAME, FP16, CENTRE, D)                                                         \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      NAME(const dm::quant_passes::Params p, int stats_rows) {                                               \
    dm::quant_passes::stats_block<FP16, CENTRE, false, D>(p, stats_rows);                                      \
  }
#define DM_QUANT_STATS_KERNELS(SUFFIX, D)                                                                      \
  DM_QUANT_STATS_KERNEL(dm_quant_stats_centred_bf16##SUFFIX, false, true, D)                                   \
  DM_QUANT_STATS_KERNEL(dm_quant_stats_absmax_bf16##SUFFIX, false, false, D)                                   \
  DM_QUANT_STATS_KERNEL(dm_quant_stats_centred_fp16##SUFFIX, true, true, D)                                    \
  DM_QUANT_STATS_KERNEL(dm_quant_stats_absmax_fp16##SUFFIX, true, false, D)
DM_QUANT_STATS_KERNELS(, 128)
DM_QUANT_STATS_KERNELS(_d64, 64)
#undef DM_QUANT_STATS_KERNELS
#undef DM_QUANT_STATS_KERNEL

#define DM_QUANT_DUAL_KERNEL(ROWS, CENTRED, ORDER, DTYPE, FP16, CENTRE, FRAGMENT, SUFFIX, D)                   \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      dm_quant_dual_##ROWS##CENTRED##_##ORDER##_##DTYPE##SUFFIX(const dm::quant_passes::Params p) {          \
    dm::quant_passes::dual_block<ROWS, FP16, CENTRE, FRAGMENT, true, true, D>(p);                            \
  }
#define DM_QUANT_DUAL_ORDERS(ROWS, CENTRED, DTYPE, FP16, CENTRE, SUFFIX, D)                                    \
  DM_QUANT_DUAL_KERNEL(ROWS, CENTRED, natural, DTYPE, FP16, CENTRE, false, SUFFIX, D)                          \
  DM_QUANT_DUAL_KERNEL(ROWS, CENTRED, fragment, DTYPE, FP16, CENTRE, true, SUFFIX, D)
#define DM_QUANT_DUAL_FORMS(DTYPE, FP16, SUFFIX, D)                                                            \
  DM_QUANT_DUAL_ORDERS(64, , DTYPE, FP16, false, SUFFIX, D)                                                    \
  DM_QUANT_DUAL_ORDERS(64, _centred, DTYPE, FP16, true, SUFFIX, D)                                             \
  DM_QUANT_DUAL_ORDERS(128, , DTYPE, FP16, false, SUFFIX, D)                                                   \
  DM_QUANT_DUAL_ORDERS(128, _centred, DTYPE, FP16, true, SUFFIX, D)                                            \
  /* the block-scaled token-major cast alone, 128-row blocks (Q's) */                                          \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      dm_quant_block_128_##DTYPE##SUFFIX(const dm::quant_passes::Params p) {                                 \
    dm::quant_passes::dual_block<128, FP16, false, false, false, true, D>(p);                                  \
  }
DM_QUANT_DUAL_FORMS(bf16, false, , 128)
DM_QUANT_DUAL_FORMS(fp16, true, , 128)
DM_QUANT_DUAL_FORMS(bf16, false, _d64, 64)
DM_QUANT_DUAL_FORMS(fp16, true, _d64, 64)
#undef DM_QUANT_DUAL_FORMS
#undef DM_QUANT_DUAL_ORDERS
#undef DM_QUANT_DUAL_KERNEL

// Q'ᶜ (the rows times their scales rs): the per-channel max |x|, then the channel-major cast alone, 128 rows a CTA
#define DM_QUANT_SCALED_KERNELS(DTYPE, FP16, SUFFIX, D)                                                        \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      dm_quant_stats_scaled_##DTYPE##SUFFIX(const dm::quant_passes::Params p, int stats_rows, const float* rs) {  \
    dm::quant_passes::stats_block<FP16, false, true, D>(p, stats_rows, rs);                                    \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      dm_quant_channel_scaled_natural_##DTYPE##SUFFIX(const dm::quant_passes::Params p, const float* rs) {    \
    dm::quant_passes::dual_block<128, FP16, false, false, true, false, D>(p, rs);                              \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(dm::quant_passes::kThreads)                                    \
      dm_quant_channel_scaled_fragment_##DTYPE##SUFFIX(const dm::quant_passes::Params p, const float* rs) {   \
    dm::quant_passes::dual_block<128, FP16, false, true, true, false, D>(p, rs);                               \
  }
DM_QUANT_SCALED_KERNELS(bf16, false, , 128)
DM_QUANT_SCALED_KERNELS(fp16, true, , 128)
DM_QUANT_SCALED_KERNELS(bf16, false, _d64, 64)
DM_QUANT_SCALED_KERNELS(fp16, true, _d64, 64)
#undef DM_QUANT_SCALED_KERNELS

namespace {

using namespace dm::quant_passes;
using StatsKernel = void (*)(const Params, int);
using CastKernel = void (*)(const Params);
using ScaledKernel = void (*)(const Params, const float*);
using ScaledStatsKernel = void (*)(const Params, int, const float*);

// The kernels of each entry at head dim D (S: their names' ending), in the entries' order.
template <int D>
struct Kernels;
#define DM_QUANT_KERNEL_TABLE(D, S)                                                                             \
  template <>                                                                                                  \
  struct Kernels<D> {                                                                                          \
    static constexpr StatsKernel stats[4] = {dm_quant_stats_absmax_bf16##S, dm_quant_stats_centred_bf16##S,    \
                                             dm_quant_stats_absmax_fp16##S, dm_quant_stats_centred_fp16##S};   \
    static constexpr CastKernel block[2] = {dm_quant_block_128_bf16##S, dm_quant_block_128_fp16##S};           \
    static constexpr CastKernel dual[16] = {                                                                   \
        dm_quant_dual_64_natural_bf16##S,          dm_quant_dual_64_fragment_bf16##S,                          \
        dm_quant_dual_64_centred_natural_bf16##S,  dm_quant_dual_64_centred_fragment_bf16##S,                  \
        dm_quant_dual_128_natural_bf16##S,         dm_quant_dual_128_fragment_bf16##S,                         \
        dm_quant_dual_128_centred_natural_bf16##S, dm_quant_dual_128_centred_fragment_bf16##S,                 \
        dm_quant_dual_64_natural_fp16##S,          dm_quant_dual_64_fragment_fp16##S,                          \
        dm_quant_dual_64_centred_natural_fp16##S,  dm_quant_dual_64_centred_fragment_fp16##S,                  \
        dm_quant_dual_128_natural_fp16##S,         dm_quant_dual_128_fragment_fp16##S,                         \
        dm_quant_dual_128_centred_natural_fp16##S, dm_quant_dual_128_centred_fragment_fp16##S};                \
    static constexpr ScaledStatsKernel stats_scaled[2] = {dm_quant_stats_scaled_bf16##S,                       \
                                                          dm_quant_stats_scaled_fp16##S};                      \
    static constexpr ScaledKernel channel_scaled[4] = {                                                        \
        dm_quant_channel_scaled_natural_bf16##S, dm_quant_channel_scaled_fragment_bf16##S,                     \
        dm_quant_channel_scaled_natural_fp16##S, dm_quant_channel_scaled_fragment_fp16##S};                    \
  };
DM_QUANT_KERNEL_TABLE(128, )
DM_QUANT_KERNEL_TABLE(64, _d64)
#undef DM_QUANT_KERNEL_TABLE

template <int D>
int quant_stats(const Params& p, int stats_rows, int device, cudaStream_t stream) {
  if (p.n <= 0 || stats_rows <= 0 || stats_rows % kStatsChunk || p.n_blocks != (p.n + stats_rows - 1) / stats_rows) {
    return cudaErrorInvalidValue;
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  const dim3 grid(p.n_blocks, p.b * p.h);
  Kernels<D>::stats[2 * (p.in_fp16 != 0) + (p.centre != 0)]<<<grid, kThreads, 0, stream>>>(p, stats_rows);
  return cudaGetLastError();
}

template <int D>
int quant_dual(const Params& p, int channel, int device, cudaStream_t stream) {
  if (p.n <= 0 || p.n_pad % 128 || (p.block_rows != 64 && p.block_rows != 128)) return cudaErrorInvalidValue;
  if (!channel && (p.block_rows != 128 || p.centre || p.fragment_order)) return cudaErrorInvalidValue;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  const dim3 grid(p.n_pad / p.block_rows, p.b * p.h);
  if (!channel) {
    Kernels<D>::block[p.in_fp16 != 0]<<<grid, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  Kernels<D>::dual[8 * (p.in_fp16 != 0) + (p.block_rows == 128 ? 4 : 0) + 2 * (p.centre != 0) +
                   (p.fragment_order != 0)]<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int D>
int quant_channel_scaled(const Params& p, int stats_rows, const float* rs, int device, cudaStream_t stream) {
  if (p.n <= 0 || p.n_pad % 128 || p.block_rows != 128 || p.centre || rs == nullptr || stats_rows <= 0 ||
      stats_rows % kStatsChunk || p.n_blocks != (p.n + stats_rows - 1) / stats_rows) {
    return cudaErrorInvalidValue;
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  Kernels<D>::stats_scaled[p.in_fp16 != 0]<<<dim3(p.n_blocks, p.b * p.h), kThreads, 0, stream>>>(p, stats_rows, rs);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  Kernels<D>::channel_scaled[2 * (p.in_fp16 != 0) + (p.fragment_order != 0)]<<<dim3(p.n_pad / 128, p.b * p.h),
                                                                             kThreads, 0, stream>>>(p, rs);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

int dm_quant_params_size() { return int(sizeof(dm::quant_passes::Params)); }

// Per-channel statistics (mean and scales, or scales) of x, stats_rows rows a CTA (a multiple of 128): p.tickets
// zeroed, p.part, p.scale_c (and p.mean) set. ..._d64: x of head dim 64 (p's tensors sized by it).
int dm_quant_stats(const dm::quant_passes::Params* p, int stats_rows, int device, cudaStream_t stream) {
  return quant_stats<128>(*p, stats_rows, device, stream);
}
int dm_quant_stats_d64(const dm::quant_passes::Params* p, int stats_rows, int device, cudaStream_t stream) {
  return quant_stats<64>(*p, stats_rows, device, stream);
}

// Both casts of x with the scales dm_quant_stats wrote: p.x8, p.sx (block_rows 64 or 128), p.x8t; with channel 0 the
// block-scaled one alone (block_rows 128, no centring; no statistics needed).
int dm_quant_dual(const dm::quant_passes::Params* p, int channel, int device, cudaStream_t stream) {
  return quant_dual<128>(*p, channel, device, stream);
}
int dm_quant_dual_d64(const dm::quant_passes::Params* p, int channel, int device, cudaStream_t stream) {
  return quant_dual<64>(*p, channel, device, stream);
}

// Q'ᶜ of x with row scales rs (B, H, N_pad): p.tickets zeroed, p.part, p.scale_c (the channel scales) and p.x8t
// (channel-major codes, in fragment_token_order where p.fragment_order) set; p.block_rows 128, p.centre 0.
int dm_quant_channel_scaled(const dm::quant_passes::Params* p, int stats_rows, const float* rs, int device,
                            cudaStream_t stream) {
  return quant_channel_scaled<128>(*p, stats_rows, rs, device, stream);
}
int dm_quant_channel_scaled_d64(const dm::quant_passes::Params* p, int stats_rows, const float* rs, int device,
                                cudaStream_t stream) {
  return quant_channel_scaled<64>(*p, stats_rows, rs, device, stream);
}

}  // extern "C"
