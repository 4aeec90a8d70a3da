"""A lane-level model of kernels/cuda/dkdv_factored.cu's two ways of writing dQ's dŜ tile: ``to_fragments_transposed``
(byte stores) and ``to_fragments_exchanged`` (a lane exchange, then word stores; the ``ws3x`` form). It checks which
(key, query) element each places at which byte of the tile, the fragments each thread keeps, and the banks of each
word store. It checked the index arithmetic before the kernel ran on a GPU (session 22); the GPU test that holds the
kernel itself is tests/kernels/test_cuda_gpu.py::test_the_ds_tile_by_lane_exchange_gives_ws3s_bits.

    python tools/ds_exchange_model.py
"""


def chunk_offset(row, chunk):  # QTile (KMajor128, 128-byte swizzle)
    return row * 128 + ((chunk ^ (row & 7)) << 4)


def byte_perm(x, y, s):  # __byte_perm: bytes 0-3 from x, 4-7 from y
    src = list(x) + list(y)
    return [src[(s >> (4 * i)) & 7] for i in range(4)]


def lane(t):
    return (t // 32) % 4, (t % 32) // 4, t % 4


def dpt_of(t, key0):
    """A consumer thread's dŜᵀ accumulator as (key, query) labels: value 4i + v is row 16 warp + g + 8 (v // 2), column
    8i + 2q + v % 2 (wgmma.cuh's layout)."""
    warp, g, q = lane(t)
    return [(key0 + 16 * warp + g + 8 * (v // 2), 8 * i + 2 * q + v % 2) for i in range(8) for v in range(4)]


def cvt4(d, v0):  # cvt_e4m3x4's bytes 0-3
    return [d[v0], d[v0 + 1], d[v0 + 4], d[v0 + 5]]


def transposed(key0):
    ds, frags = {}, {}
    for t in range(128):
        warp, g, q = lane(t)
        d = dpt_of(t, key0)
        for kk in range(2):
            for r in range(4):
                h16, v0 = 2 * kk + r // 2, 8 * (2 * kk + r // 2) + 2 * (r % 2)
                codes = cvt4(d, v0)
                frags[t, kk, r] = codes
                key, at, query = key0 + 16 * warp, 4 * (g >> 1) + 2 * (r % 2) + (g & 1), 16 * h16 + 2 * q
                for j in range(4):
                    off = chunk_offset(query + (j & 1) + 8 * (j >> 1), key >> 4) + at
                    assert off not in ds
                    ds[off] = codes[j]
    return ds, frags


def exchanged(key0):
    ds, frags = {}, {}
    for kk in range(2):
        for m in range(2):
            h16 = 2 * kk + m
            sends, keeps = {}, {}
            for t in range(128):
                p = lane(t)[1] & 1
                d = dpt_of(t, key0)
                codes = [cvt4(d, 8 * h16 + 2 * rr) for rr in range(2)]
                for rr in range(2):
                    frags[t, kk, 2 * m + rr] = codes[rr]
                keep_sel, send_sel = (0x7531, 0x6420) if p else (0x6420, 0x7531)
                keeps[t] = byte_perm(codes[0], codes[1], keep_sel)
                sends[t] = byte_perm(codes[0], codes[1], send_sel)
            for t in range(128):
                warp, g, q = lane(t)
                p = g & 1
                lo_sel, hi_sel = (0x2604, 0x3715) if p else (0x6240, 0x7351)
                got = sends[(t // 32) * 32 + ((t % 32) ^ 4)]  # __shfl_xor_sync(.., 4)
                base = chunk_offset(2 * q + p, (key0 + 16 * warp) >> 4) + 4 * (g >> 1)
                for off, word in ((base + 16 * h16 * 128, byte_perm(keeps[t], got, lo_sel)),
                                  (base + (16 * h16 + 8) * 128, byte_perm(keeps[t], got, hi_sel))):
                    assert off % 4 == 0
                    for j in range(4):
                        assert off + j not in ds
                        ds[off + j] = word[j]
    return ds, frags


def check_banks(key0):
    """Each word store's 32 lanes write 32 distinct banks."""
    for h16 in range(4):
        for warp in range(4):
            for hi in (0, 1):
                banks = set()
                for t in range(32):
                    g, q = t // 4, t % 4
                    off = (chunk_offset(2 * q + (g & 1), (key0 + 16 * warp) >> 4) + 4 * (g >> 1)
                           + (16 * h16 + 8 * hi) * 128)
                    banks.add((off // 4) % 32)
                assert len(banks) == 32, (h16, warp, hi, len(banks))


def main():
    for key0 in (0, 64):  # the two consumers' halves of the 128-key tile
        a, fa = transposed(key0)
        b, fb = exchanged(key0)
        assert a == b and fa == fb, key0
        assert len(a) == 64 * 64 and all(off // 128 == query for off, (_, query) in a.items())
        check_banks(key0)
    print("the same bytes in the same places and the same fragments; every word store conflict-free")


if __name__ == "__main__":
    main()
