// M1 primitives of the CUDA backward (kernels/CUDA_BACKWARD.md section 5), each behind a small test kernel that the
// GPU tests compare with torch: one FP8 wgmma tile product 64 x N x 128 (four k = 32 steps) with both operands in
// shared memory (SS) or A in registers (RS, loaded either in fragment order or in accumulator order and permuted), and
// the e4m3 quantiser. C entry points take plain pointers and a cudaStream_t and return a cudaError_t as int.
#include <cuda_runtime.h>

#include <cstdint>

#include "quant.cuh"
#include "wgmma.cuh"

namespace dm {

constexpr int kWarpgroup = 128;  // threads issuing one wgmma
constexpr int kTileM = 64;       // wgmma's M
constexpr int kTileK = 128;      // the contraction, e.g. D = 128: four k = 32 steps
using Tile = KMajor128<Swizzle::k128B>;

// A row-major ROWS x 128 tile of codes from global memory (16-byte aligned) into shared memory in layout SW.
template <int ROWS, Swizzle SW>
__device__ __forceinline__ void load_tile(uint8_t* smem, const uint8_t* gmem) {
  static_assert(KMajor128<SW>::kRowBytes == kTileK, "one 128-byte row per K-major row");
  for (int i = threadIdx.x; i < ROWS * kTileK / 16; i += kWarpgroup) {
    const int row = i / (kTileK / 16), chunk = i % (kTileK / 16);
    *reinterpret_cast<uint4*>(smem + KMajor128<SW>::chunk_offset(row, chunk)) =
        reinterpret_cast<const uint4*>(gmem)[i];
  }
}

// The accumulator (64 x N) to a row-major FP32 matrix.
template <int N>
__device__ __forceinline__ void store_accumulator(float* c, const float (&d)[N / 2]) {
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    const int row = 16 * warp + g, col = 8 * i + 2 * q;
    *reinterpret_cast<float2*>(c + row * N + col) = make_float2(d[4 * i], d[4 * i + 1]);
    *reinterpret_cast<float2*>(c + (row + 8) * N + col) = make_float2(d[4 * i + 2], d[4 * i + 3]);
  }
}

// C [64, N] = A [64, 128] B [N, 128]^T on codes, both operands through shared memory in layout SW.
template <int N, Swizzle SW>
__device__ __forceinline__ void wgmma_ss_tile(const uint8_t* a, const uint8_t* b, float* c) {
  __shared__ __align__(1024) uint8_t a_smem[kTileM * kTileK];  // [64, 128] K-major
  __shared__ __align__(1024) uint8_t b_smem[N * kTileK];       // [N, 128] K-major
  load_tile<kTileM, SW>(a_smem, a);
  load_tile<N, SW>(b_smem, b);
  fence_async_shared();
  __syncthreads();

  float d[N / 2] = {};  // [64, N] in accumulator order
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < KMajor128<SW>::kSteps; ++k) {
    WgmmaE4M3<N>::ss(d, KMajor128<SW>::desc(a_smem, k), KMajor128<SW>::desc(b_smem, k), k > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  store_accumulator<N>(c, d);
}

// The same product with A from registers (B in the 128-byte swizzle). `from_accumulator` = 0: each thread loads its A
// fragment bytes directly; 1: it loads the bytes an FP32 accumulator row of A would give it (the way P and dS arrive
// in the backward) and permutes them with acc_to_a_fragment. Both must give the same product.
template <int N>
__device__ __forceinline__ void wgmma_rs_tile(const uint8_t* a, const uint8_t* b, float* c, int from_accumulator) {
  __shared__ __align__(1024) uint8_t b_smem[N * kTileK];
  load_tile<N, Swizzle::k128B>(b_smem, b);

  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
  uint32_t frag[Tile::kSteps][4];  // [k-step][register], 4 codes each
#pragma unroll
  for (int k = 0; k < Tile::kSteps; ++k) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint8_t* half_row = a + (16 * warp + g + 8 * (j % 2)) * kTileK + 32 * k + 16 * (j / 2);
      if (from_accumulator) {
        const uint32_t lo = *reinterpret_cast<const uint16_t*>(half_row + 2 * q);
        const uint32_t hi = *reinterpret_cast<const uint16_t*>(half_row + 8 + 2 * q);
        frag[k][j] = acc_to_a_fragment(lo | (hi << 16));
      } else {
        frag[k][j] = *reinterpret_cast<const uint32_t*>(half_row + 4 * q);
      }
    }
  }
  fence_async_shared();
  __syncthreads();

  float d[N / 2] = {};
#pragma unroll
  for (int k = 0; k < Tile::kSteps; ++k) fence_operands(frag[k]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < Tile::kSteps; ++k) WgmmaE4M3<N>::rs(d, frag[k], Tile::desc(b_smem, k), k > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  store_accumulator<N>(c, d);
}

}  // namespace dm

// Kernels by plain names, so the SASS check (deltamatch.kernels.cuda_build.KERNELS) finds each one's instructions.
#define DM_SS_KERNEL(NAME, N, SW)                                                                     \
  extern "C" __global__ void __launch_bounds__(dm::kWarpgroup, 1)                                     \
      NAME(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b, float* __restrict__ c) {     \
    dm::wgmma_ss_tile<N, SW>(a, b, c);                                                                \
  }
DM_SS_KERNEL(dm_wgmma_ss_n64_noswizzle, 64, dm::Swizzle::kNone)
DM_SS_KERNEL(dm_wgmma_ss_n64_swizzle128, 64, dm::Swizzle::k128B)
DM_SS_KERNEL(dm_wgmma_ss_n128_swizzle128, 128, dm::Swizzle::k128B)
#undef DM_SS_KERNEL

#define DM_RS_KERNEL(NAME, N)                                                                         \
  extern "C" __global__ void __launch_bounds__(dm::kWarpgroup, 1) NAME(                               \
      const uint8_t* __restrict__ a, const uint8_t* __restrict__ b, float* __restrict__ c, int from_accumulator) { \
    dm::wgmma_rs_tile<N>(a, b, c, from_accumulator);                                                  \
  }
DM_RS_KERNEL(dm_wgmma_rs_n64_swizzle128, 64)
DM_RS_KERNEL(dm_wgmma_rs_n128_swizzle128, 128)
#undef DM_RS_KERNEL

// The swapped dP̂ tile of the fused backward (CUDA_BACKWARD.md 3.2, matmul 4): dP̂ᵀ [64 keys, 64 queries] = V̂ dÔᵀ ·
// (s_v · s_dO), keys as wgmma's M (V̂ rows the A operand, dÔ rows the B operand, both K-major over D = 128). The
// Triton δ pass forms the same products unswapped (dÔ V̂ᵀ, 128 queries as M); the dS row-sum property needs the two to
// agree bit for bit (section 3.5), which the GPU test checks.
extern "C" __global__ void __launch_bounds__(dm::kWarpgroup, 1)
    dm_dpt_tile_n64(const uint8_t* __restrict__ v, const uint8_t* __restrict__ d_o, float s_v, float s_do,
                    float* __restrict__ dpt) {
  __shared__ __align__(1024) uint8_t v_smem[dm::kTileM * dm::kTileK];
  __shared__ __align__(1024) uint8_t do_smem[64 * dm::kTileK];
  dm::load_tile<dm::kTileM, dm::Swizzle::k128B>(v_smem, v);
  dm::load_tile<64, dm::Swizzle::k128B>(do_smem, d_o);
  dm::fence_async_shared();
  __syncthreads();
  float d[32] = {};
  dm::wgmma_fence();
#pragma unroll
  for (int k = 0; k < dm::Tile::kSteps; ++k) {
    dm::WgmmaE4M3<64>::ss(d, dm::Tile::desc(v_smem, k), dm::Tile::desc(do_smem, k), k > 0);
  }
  dm::wgmma_commit();
  dm::wgmma_wait<0>();
  dm::fence_operands(d);
  const float scale = s_v * s_do;
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] *= scale;
  dm::store_accumulator<64>(dpt, d);
}

// codes[i] = e4m3(x[i] * mul), saturating; one cvt per pair, the odd last element alone.
extern "C" __global__ void dm_quant_e4m3(const float* __restrict__ x, uint8_t* __restrict__ codes, int64_t n,
                                         float mul) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 2; i += stride) {
    reinterpret_cast<uint16_t*>(codes)[i] = dm::cvt_e4m3x2(x[2 * i] * mul, x[2 * i + 1] * mul);
  }
  if (n % 2 && blockIdx.x == 0 && threadIdx.x == 0) codes[n - 1] = uint8_t(dm::cvt_e4m3x2(x[n - 1] * mul, 0.0f));
}

// ---- C entry points (ctypes: deltamatch.kernels.cuda_lib) --------------------------------------------------------
// The runtime is linked statically, so it keeps its own current device: every entry point sets the caller's first.
// It shares the driver's primary context with torch, so torch's pointers and streams are valid here.

extern "C" {

// Bumped whenever an entry point is added or its signature changes; the loader refuses a library of another version.
int dm_attn_sm90_abi_version(void) { return 18; }

const char* dm_attn_sm90_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

// c [64, n] (FP32, row-major) = a [64, 128] b [n, 128]^T on e4m3 codes; n in {64, 128}; swizzle 0 (n = 64 only) or 1.
int dm_wgmma_ss_tile(const void* a, const void* b, float* c, int n, int swizzle, int device, cudaStream_t stream) {
  void (*kernel)(const uint8_t*, const uint8_t*, float*) = nullptr;
  if (n == 64) kernel = swizzle ? dm_wgmma_ss_n64_swizzle128 : dm_wgmma_ss_n64_noswizzle;
  if (n == 128 && swizzle) kernel = dm_wgmma_ss_n128_swizzle128;
  if (!kernel) return cudaErrorInvalidValue;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  kernel<<<1, dm::kWarpgroup, 0, stream>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), c);
  return cudaGetLastError();
}

// The same product with a from registers; from_accumulator 1 loads a in accumulator order and permutes it.
int dm_wgmma_rs_tile(const void* a, const void* b, float* c, int n, int from_accumulator, int device,
                     cudaStream_t stream) {
  void (*kernel)(const uint8_t*, const uint8_t*, float*, int) = nullptr;
  if (n == 64) kernel = dm_wgmma_rs_n64_swizzle128;
  if (n == 128) kernel = dm_wgmma_rs_n128_swizzle128;
  if (!kernel) return cudaErrorInvalidValue;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  kernel<<<1, dm::kWarpgroup, 0, stream>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), c,
                                           from_accumulator);
  return cudaGetLastError();
}

// dpt [64, 64] (FP32, row-major, keys x queries) = v [64, 128] d_o [64, 128]^T * (s_v * s_do) on e4m3 codes.
int dm_dpt_tile(const void* v, const void* d_o, float s_v, float s_do, float* dpt, int device, cudaStream_t stream) {
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  dm_dpt_tile_n64<<<1, dm::kWarpgroup, 0, stream>>>(static_cast<const uint8_t*>(v), static_cast<const uint8_t*>(d_o),
                                                    s_v, s_do, dpt);
  return cudaGetLastError();
}

// codes [n] = e4m3(x [n] * mul) (codes 2-byte aligned).
int dm_quant_e4m3_launch(const float* x, void* codes, int64_t n, float mul, int device, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  const int threads = 256;
  const int64_t blocks = (n / 2 + threads - 1) / threads;
  dm_quant_e4m3<<<blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks), threads, 0, stream>>>(
      x, static_cast<uint8_t*>(codes), n, mul);
  return cudaGetLastError();
}

}  // extern "C"
