// sbod GPU parity kernels. Compiled at run time with NVRTC (or loaded from the PTX that
// scripts/gen-ptx.sh made from this file), so building sbod needs no CUDA toolkit.
//
// Layout: a batch is one device buffer of `slots` shards, shard s at word offset
// s * stride (uint4 words, 16 bytes). Each kernel reads a list of source slots and writes
// a list of destination slots over the word range [begin, end), so a batch can be split
// into segments that overlap with transfers on several streams.
//
// Every kernel here has a bit-exact model in src/emu.rs (same word order, same tables,
// same byte permutations); change both together. The tests run the model everywhere and
// the kernels wherever a CUDA device is present.

typedef unsigned int u32;
typedef unsigned long long u64;

// Rows of parity one general-kernel block computes: a table word packs the products for
// 4 rows, one per byte.
#define ROWS_PER_GROUP 4
// Table words per source: 16 for the low nibble, 16 for the high nibble.
#define TABLE_WORDS 32

// Bytes r of t0..t3 gathered into one word: the 4x4 byte transpose that turns
// "per data byte, 4 rows" into "per row, 4 data bytes".
__device__ __forceinline__ void transpose4(u32 t0, u32 t1, u32 t2, u32 t3, u32 out[4])
{
    u32 a = __byte_perm(t0, t1, 0x5140);
    u32 b = __byte_perm(t2, t3, 0x5140);
    u32 c = __byte_perm(t0, t1, 0x7362);
    u32 d = __byte_perm(t2, t3, 0x7362);
    out[0] = __byte_perm(a, b, 0x5410);
    out[1] = __byte_perm(a, b, 0x7632);
    out[2] = __byte_perm(c, d, 0x5410);
    out[3] = __byte_perm(c, d, 0x7632);
}

// t[b] ^= products (4 rows packed) of byte b of w, from one source's split-nibble table.
// The 16 low-nibble words and the 16 high-nibble words each sit in 16 distinct banks,
// so a warp's lookups never conflict: equal nibbles read the same word (broadcast).
// Nibbles are turned into byte offsets (x4) for a whole word at once, and each byte's
// offset is pulled out with one byte permute, so a lookup costs one ALU op and one LDS.
__device__ __forceinline__ void gf_acc(u32 t[4], u32 w, const u32* tj)
{
    const u32 lo = (w << 2) & 0x3c3c3c3cu;
    const u32 hi = (w >> 2) & 0x3c3c3c3cu;
    const char* tb = (const char*)tj;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const u32 ol = __byte_perm(lo, 0, 0x4440 + b);
        const u32 oh = __byte_perm(hi, 0, 0x4440 + b);
        t[b] ^= *(const u32*)(tb + ol) ^ *(const u32*)(tb + 4 * 16 + oh);
    }
}

// Multiply each of the 4 bytes of q by 2 in GF(2^8), polynomial 0x11d.
__device__ __forceinline__ u32 mul2x4(u32 q)
{
    const u32 carry = (q >> 7) & 0x01010101u;
    return ((q & 0x7f7f7f7fu) << 1) ^ (carry * 0x1du);
}

__device__ __forceinline__ uint4 xor4(uint4 a, uint4 b)
{
    return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

// Shared-memory image: source word offsets (u64, slot * stride) first, then tables.
// plan (global): [ngroups][nsrc][TABLE_WORDS] tables, then nsrc source slots, then nrow
// destination slots (u32 each).
//
// General GF(2^8) matrix apply: out[d] = sum_j coef[d][j] * in[j]. blockIdx.y picks a
// group of up to 4 rows.
extern "C" __global__ void __launch_bounds__(256)
sbod_gf_apply(const uint4* __restrict__ in, uint4* __restrict__ out, u64 stride, u64 begin,
              u64 end, const u32* __restrict__ plan, int nsrc, int nrow)
{
    extern __shared__ u64 sh64[];
    u64* off = sh64;
    u32* tab = (u32*)(sh64 + nsrc);
    const int ngroups = (nrow + ROWS_PER_GROUP - 1) / ROWS_PER_GROUP;
    const int group = blockIdx.y;
    const u32* tables = plan + (u64)group * nsrc * TABLE_WORDS;
    const u32* src_slot = plan + (u64)ngroups * nsrc * TABLE_WORDS;
    const u32* dst_slot = src_slot + nsrc;
    for (int i = threadIdx.x; i < nsrc * TABLE_WORDS; i += blockDim.x)
        tab[i] = tables[i];
    for (int i = threadIdx.x; i < nsrc; i += blockDim.x)
        off[i] = (u64)src_slot[i] * stride;
    __syncthreads();

    const int rows = min(ROWS_PER_GROUP, nrow - group * ROWS_PER_GROUP);
    u64 dst[ROWS_PER_GROUP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_GROUP; ++r)
        dst[r] = r < rows ? (u64)dst_slot[group * ROWS_PER_GROUP + r] * stride : 0;

    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 col = begin + (u64)blockIdx.x * blockDim.x + threadIdx.x; col < end; col += step) {
        // t[w][b]: byte r holds row r's product sum for byte b of word w of this column.
        u32 t[4][4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int b = 0; b < 4; ++b)
                t[w][b] = 0;
#pragma unroll 4
        for (int j = 0; j < nsrc; ++j) {
            const uint4 v = __ldcs(in + off[j] + col);
            const u32* tj = tab + j * TABLE_WORDS;
            gf_acc(t[0], v.x, tj);
            gf_acc(t[1], v.y, tj);
            gf_acc(t[2], v.z, tj);
            gf_acc(t[3], v.w, tj);
        }
        u32 o0[4], o1[4], o2[4], o3[4];
        transpose4(t[0][0], t[0][1], t[0][2], t[0][3], o0);
        transpose4(t[1][0], t[1][1], t[1][2], t[1][3], o1);
        transpose4(t[2][0], t[2][1], t[2][2], t[2][3], o2);
        transpose4(t[3][0], t[3][1], t[3][2], t[3][3], o3);
#pragma unroll
        for (int r = 0; r < ROWS_PER_GROUP; ++r)
            if (r < rows)
                __stcs(out + dst[r] + col, make_uint4(o0[r], o1[r], o2[r], o3[r]));
    }
}

// Load the source word offsets of a plan into shared memory (XOR and P+Q kernels).
__device__ __forceinline__ void load_offsets(u64* off, const u32* src_slot, int nsrc, u64 stride)
{
    for (int i = threadIdx.x; i < nsrc; i += blockDim.x)
        off[i] = (u64)src_slot[i] * stride;
    __syncthreads();
}

// out[dst0] = XOR of every source (raid5 parity, or a rebuild whose decode row is all 1s).
extern "C" __global__ void __launch_bounds__(256)
sbod_xor(const uint4* __restrict__ in, uint4* __restrict__ out, u64 stride, u64 begin,
         u64 end, const u32* __restrict__ plan, int nsrc, int nrow)
{
    extern __shared__ u64 sh64[];
    const u32* src_slot = plan + (u64)nsrc * TABLE_WORDS;
    const u64 dst = (u64)src_slot[nsrc] * stride;
    load_offsets(sh64, src_slot, nsrc, stride);
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 col = begin + (u64)blockIdx.x * blockDim.x + threadIdx.x; col < end; col += step) {
        uint4 p = make_uint4(0, 0, 0, 0);
#pragma unroll 4
        for (int j = 0; j < nsrc; ++j)
            p = xor4(p, __ldcs(in + sh64[j] + col));
        __stcs(out + dst + col, p);
    }
}

// md raid6: P = XOR of the sources, Q = sum 2^j * source j, by Horner's rule from the
// last source down (each step doubles the running Q and adds the next source).
extern "C" __global__ void __launch_bounds__(256)
sbod_pq(const uint4* __restrict__ in, uint4* __restrict__ out, u64 stride, u64 begin,
        u64 end, const u32* __restrict__ plan, int nsrc, int nrow)
{
    extern __shared__ u64 sh64[];
    const u32* src_slot = plan + (u64)nsrc * TABLE_WORDS;
    const u64 dp = (u64)src_slot[nsrc] * stride;
    const u64 dq = (u64)src_slot[nsrc + 1] * stride;
    load_offsets(sh64, src_slot, nsrc, stride);
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 col = begin + (u64)blockIdx.x * blockDim.x + threadIdx.x; col < end; col += step) {
        uint4 p = make_uint4(0, 0, 0, 0);
        uint4 q = make_uint4(0, 0, 0, 0);
#pragma unroll 4
        for (int j = nsrc - 1; j >= 0; --j) {
            const uint4 v = __ldcs(in + sh64[j] + col);
            p = xor4(p, v);
            q = make_uint4(mul2x4(q.x) ^ v.x, mul2x4(q.y) ^ v.y, mul2x4(q.z) ^ v.z,
                           mul2x4(q.w) ^ v.w);
        }
        __stcs(out + dp + col, p);
        __stcs(out + dq + col, q);
    }
}

// Device-to-device streaming copy: the bandwidth a kernel of this shape can reach.
extern "C" __global__ void __launch_bounds__(256)
sbod_copy(const uint4* __restrict__ in, uint4* __restrict__ out, u64 words)
{
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += step)
        __stcs(out + i, __ldcs(in + i));
}
