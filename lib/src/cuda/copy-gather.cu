/*
 * The gather copy: a kernel that reads rows of pinned, mapped host memory straight
 * through the device's mapping of it and writes them to device memory. It stands in
 * for cudaMemcpy2DAsync where the copy engine is slow: rows far apart (on the H200 the
 * transposed V window at a 64 KiB pitch takes 1.5x the contiguous floor as one 2-D
 * copy). Every thread keeps L 16-byte loads in flight before it stores any, so the
 * bus sees many outstanding reads; a warp's loads are consecutive bytes of one row.
 *
 * The paged gather: a paged window's runs of blocks in one launch, each piece's rows read in
 * the widest words its addresses, sizes and strides allow (16, 4 or 1 bytes), a block per piece
 * and index of grid.y, its threads on consecutive words.
 */
#include "cuda-ops.h"

#include <cstdint>

#define GATHER_THREADS 256

/* Rows as one flat run of 16-byte elements: element e is row e / w, column e % w. */
template <int L>
__global__ void gather_rows_kernel(uint4 * __restrict__ dst, uint64_t dpitch, const uint4 * __restrict__ src,
                                   uint64_t spitch, uint64_t w, uint64_t total, uint64_t n_chunks) {
    for (uint64_t chunk = blockIdx.x; chunk < n_chunks; chunk += gridDim.x) {
        const uint64_t first = chunk * (uint64_t) GATHER_THREADS * L + threadIdx.x;
        uint4 v[L];
        uint64_t at[L];
#pragma unroll
        for (int j = 0; j < L; j++) {
            const uint64_t e = first + (uint64_t) j * GATHER_THREADS;
            if (e < total) {
                const uint64_t r = e / w, c = e - r * w;
                v[j] = src[r * spitch + c];
                at[j] = r * dpitch + c;
            }
        }
#pragma unroll
        for (int j = 0; j < L; j++) {
            if (first + (uint64_t) j * GATHER_THREADS < total) {
                dst[at[j]] = v[j];
            }
        }
    }
}

bool ferry_cuda_gather_loads_ok(int loads) {
    return loads == 1 || loads == 2 || loads == 4 || loads == 8 || loads == 16;
}

template <int L>
static cudaError_t launch(uint4 * dst, uint64_t dpitch, const uint4 * src, uint64_t spitch, uint64_t w, uint64_t total,
                          cudaStream_t stream) {
    const uint64_t per_block = (uint64_t) GATHER_THREADS * L;
    const uint64_t n_chunks = (total + per_block - 1) / per_block;
    /* More blocks than the device holds at once buy nothing; the loop takes the rest. */
    const unsigned grid = (unsigned) (n_chunks < (1u << 20) ? n_chunks : (1u << 20));
    gather_rows_kernel<L><<<grid, GATHER_THREADS, 0, stream>>>(dst, dpitch, src, spitch, w, total, n_chunks);
    return cudaGetLastError();
}

cudaError_t ferry_cuda_gather_rows(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                                   size_t height, int loads, cudaStream_t stream) {
    const uint64_t w = width / 16, total = w * height;
    uint4 * d = (uint4 *) dst;
    const uint4 * s = (const uint4 *) src;
    const uint64_t dp = dpitch / 16, sp = spitch / 16;
    switch (loads) {
    case 1: return launch<1>(d, dp, s, sp, w, total, stream);
    case 2: return launch<2>(d, dp, s, sp, w, total, stream);
    case 4: return launch<4>(d, dp, s, sp, w, total, stream);
    case 8: return launch<8>(d, dp, s, sp, w, total, stream);
    case 16: return launch<16>(d, dp, s, sp, w, total, stream);
    default: return cudaErrorInvalidValue;
    }
}

#define PIECE_THREADS 256
#define PIECE_MAX_GRID_Y 64

/* The word a piece moves in: 16 bytes where every address, size and stride allows, else 4, else 1. */
__device__ static uint64_t piece_unit(const ferry_cuda_piece & g) {
    const uint64_t all = g.src | g.dst | g.size | g.src_stride | g.dst_stride;
    return all % 16 == 0 ? 16 : all % 4 == 0 ? 4 : 1;
}

__global__ void gather_pieces_kernel(const ferry_cuda_piece * __restrict__ pieces, uint64_t n) {
    for (uint64_t p = blockIdx.x; p < n; p += gridDim.x) {
        const ferry_cuda_piece g = pieces[p];
        const uint64_t unit = piece_unit(g), w = g.size / unit, total = w * g.count;
        const uint64_t step = (uint64_t) gridDim.y * blockDim.x;
        for (uint64_t e = (uint64_t) blockIdx.y * blockDim.x + threadIdx.x; e < total; e += step) {
            const uint64_t r = e / w, c = e - r * w;
            const char * from = (const char *) (g.src + r * g.src_stride) + c * unit;
            char * to = (char *) (g.dst + r * g.dst_stride) + c * unit;
            if (unit == 16) {
                *(uint4 *) to = *(const uint4 *) from;
            } else if (unit == 4) {
                *(uint32_t *) to = *(const uint32_t *) from;
            } else {
                *to = *from;
            }
        }
    }
}

cudaError_t ferry_cuda_gather_pieces(const ferry_cuda_piece * pieces, uint64_t n, uint64_t units,
                                     cudaStream_t stream) {
    if (n == 0) {
        return cudaSuccess;
    }
    const uint64_t per_piece = (units + PIECE_THREADS - 1) / PIECE_THREADS;
    const dim3 grid((unsigned) (n < (1u << 20) ? n : (1u << 20)),
                    (unsigned) (per_piece < 1 ? 1 : per_piece > PIECE_MAX_GRID_Y ? PIECE_MAX_GRID_Y : per_piece));
    gather_pieces_kernel<<<grid, PIECE_THREADS, 0, stream>>>(pieces, n);
    return cudaGetLastError();
}
