// FP8 (E4M3) warpgroup MMA on sm_90a through inline PTX: shared-memory matrix descriptors, the m64nNk32 SS and RS
// instructions, the fences around them, and the register permutation that turns an accumulator row into an A fragment.
//
// Layouts (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply"; the same maps as CuTe's CLayout_64xN and
// ALayout_64x32 in NVIDIA/cutlass include/cute/atom/mma_traits_sm90_gmma.hpp). A warpgroup is 128 threads; thread t
// has warp w = t / 32, g = (t % 32) / 4, q = t % 4.
//   accumulator D (64 x N, FP32): d[4i + v] holds row 16w + g + 8*(v / 2), column 8i + 2q + (v % 2).
//   A fragment (64 x 32, e4m3 in 4 registers): register j holds row 16w + g + 8*(j % 2), columns 16*(j / 2) + 4q ..
//   + 3, the lower column in the lower byte.
// FP8 wgmma reads shared-memory operands K-major only (no transpose immediates), so B is always stored N rows of K.
#pragma once
#include <cstdint>

namespace dm {

// The descriptor's layout-type field (bits 62-63): no swizzle (core matrices of 8 rows x 16 bytes), or the 128- or
// 64-byte swizzle that TMA writes.
enum class Swizzle : uint32_t { kNone = 0, k128B = 1, k64B = 2 };

// A shared-memory matrix descriptor: start address, leading and stride byte offsets, all in 16-byte units. Built as
// two 32-bit words: the low one holds the start (bits 0-13) and LBO (16-29), the high one SBO (32-45) and the swizzle
// (62-63). A shared address is below 2^18 (at most 227 KiB of shared memory), so addr >> 4 fills the 14-bit start
// field unmasked, and a step inside a tile (`desc_advance`) adds to the low word without a carry out of the field.
__device__ __forceinline__ uint64_t smem_desc(const void* start, uint32_t lbo_bytes, uint32_t sbo_bytes, Swizzle sw) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(start));
  const uint32_t lo = (addr >> 4) | ((lbo_bytes >> 4) << 16);
  const uint32_t hi = (sbo_bytes >> 4) | (static_cast<uint32_t>(sw) << 30);
  return (uint64_t(hi) << 32) | lo;
}

// The descriptor of the matrix `bytes` (a multiple of 16) after `d`'s start: one add on the low word per k-step, the
// tile's base descriptor shared by all its steps (the per-step mask, shift and or of a full rebuild cost ≈ 10
// instructions per wgmma in the CUDA kernels' loops: ncu, session 11).
__device__ __forceinline__ uint64_t desc_advance(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(d) + (bytes >> 4));
}

// A K-major tile of e4m3 codes whose rows are 128 bytes (K = 128, e.g. D = 128), read by four k = 32 steps.
//   k128B: row r at r * 128, its 16-byte chunk c at chunk c ^ (r % 8) (TMA's SWIZZLE_128B; 1024-byte aligned base).
//          A k-step moves the start 32 bytes inside the swizzle atom; SBO = 1024 (8 rows), LBO unused (16).
//   kNone: core matrix (8 rows x 16 bytes, contiguous) of row group r / 8 and chunk c at (r / 8) * 1024 + c * 128.
//          LBO = 128 (the next chunk along K), SBO = 1024 (the next 8 rows); a k-step moves the start 256 bytes.
template <Swizzle SW>
struct KMajor128 {
  static constexpr int kRowBytes = 128;
  static constexpr int kSteps = kRowBytes / 32;

  __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
    if constexpr (SW == Swizzle::k128B) {
      return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
    } else {
      return (row >> 3) * 1024 + chunk * 128 + ((row & 7) << 4);
    }
  }

  __device__ __forceinline__ static uint64_t desc(const uint8_t* tile, int k_step) {
    if constexpr (SW == Swizzle::k128B) {
      return desc_advance(smem_desc(tile, 16, 1024, SW), 32 * k_step);
    } else {
      return desc_advance(smem_desc(tile, 128, 1024, SW), 256 * k_step);
    }
  }
};

// A K-major tile of e4m3 codes whose rows are 64 bytes (K = 64, e.g. 64 queries of a token-major dÔᶜᵀ tile), without
// swizzle, read by two k = 32 steps: core matrix (8 rows x 16 bytes) of row group r / 8 and chunk c at
// (r / 8) * 512 + c * 128. LBO = 128 (the next chunk along K), SBO = 512 (the next 8 rows); a k-step moves 256 bytes.
struct KMajor64 {
  static constexpr int kRowBytes = 64;
  static constexpr int kSteps = kRowBytes / 32;

  __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
    return (row >> 3) * 512 + chunk * 128 + ((row & 7) << 4);
  }

  __device__ __forceinline__ static uint64_t desc(const uint8_t* tile, int k_step) {
    return desc_advance(smem_desc(tile, 128, 512, Swizzle::kNone), 256 * k_step);
  }
};

// The same 64-byte rows as TMA's SWIZZLE_64B writes them (a box 64 bytes wide): row r at r * 64, its 16-byte chunk c at
// chunk c ^ ((r / 2) % 4), in 512-byte atoms of 8 rows (512-byte aligned base). A k-step moves the start 32 bytes
// inside the atom; SBO = 512 (8 rows), LBO unused (16).
struct KMajor64Swizzle64 {
  static constexpr int kRowBytes = 64;
  static constexpr int kSteps = kRowBytes / 32;

  __device__ __forceinline__ static int chunk_offset(int row, int chunk) {
    return row * kRowBytes + ((chunk ^ ((row >> 1) & 3)) << 4);
  }

  __device__ __forceinline__ static uint64_t desc(const uint8_t* tile, int k_step) {
    return desc_advance(smem_desc(tile, 16, 512, Swizzle::k64B), 32 * k_step);
  }
};

// Ordering around wgmma: fence before the first MMA (and whenever registers it reads were written since), commit the
// issued MMAs as a group, wait until at most N groups are pending.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ordinary shared-memory stores become visible to the async proxy (wgmma, TMA) only after this fence and a barrier.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads or writes of registers that an in-flight wgmma owns across this point.
template <int R>
__device__ __forceinline__ void fence_operands(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_operands(uint32_t (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define DM_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])

// D (64 x N, FP32) = A (64 x 32) B (N x 32)^T + (accumulate ? D : 0), on e4m3 codes. SS: A and B by descriptor;
// RS: A from this thread's 4 fragment registers. The scale immediates are 1 (no negation).
template <int N>
struct WgmmaE4M3;

template <>
struct WgmmaE4M3<32> {
  __device__ __forceinline__ static void ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  __device__ __forceinline__ static void rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
};

template <>
struct WgmmaE4M3<64> {
  __device__ __forceinline__ static void ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8), DM_ACC8(d, 16), DM_ACC8(d, 24)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  __device__ __forceinline__ static void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8), DM_ACC8(d, 16), DM_ACC8(d, 24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
};

template <>
struct WgmmaE4M3<128> {
  __device__ __forceinline__ static void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
        "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8), DM_ACC8(d, 16), DM_ACC8(d, 24), DM_ACC8(d, 32), DM_ACC8(d, 40),
          DM_ACC8(d, 48), DM_ACC8(d, 56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
  __device__ __forceinline__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
        "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : DM_ACC8(d, 0), DM_ACC8(d, 8), DM_ACC8(d, 16), DM_ACC8(d, 24), DM_ACC8(d, 32), DM_ACC8(d, 40),
          DM_ACC8(d, 48), DM_ACC8(d, 56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
};

#undef DM_ACC8

// One 16-column half of an accumulator row, already cast to e4m3, as an A-fragment register. In accumulator order this
// thread holds columns {2q, 2q+1, 8+2q, 9+2q} (bytes 0..3 of x); the A fragment wants {4q .. 4q+3}. Columns 4q, 4q+1
// sit in the low pair of quad lane (2q) % 4 and 4q+2, 4q+3 in that of lane (2q+1) % 4 for q < 2; the high pairs of the
// same lanes for q >= 2. Two shuffles and one byte permute per register (FA3's permute_Aregs_fp8 does 64 bits with
// two of each; a later tuning step).
__device__ __forceinline__ uint32_t acc_to_a_fragment(uint32_t x) {
  const int lane = threadIdx.x & 31, q = lane & 3, quad = lane & ~3;
  const uint32_t first = __shfl_sync(0xffffffffu, x, quad | ((2 * q) & 3));
  const uint32_t second = __shfl_sync(0xffffffffu, x, quad | ((2 * q + 1) & 3));
  return __byte_perm(first, second, q < 2 ? 0x5410 : 0x7632);
}

}  // namespace dm
