/*
 * How the stand-in's link writes its memory: as a copy engine does, past the host's cache, for
 * bulk transfers. A memcpy reads each destination line for ownership before writing it, so a
 * copy beyond the cache moves three bytes for each one copied; non-temporal stores move two. On
 * the dev VM (32 MiB L3) a 4 MiB copy ran at 5.8 to 6.4 GB/s by memcpy and 9.5 to 12 GB/s
 * streamed (2026-12-03), so a stand-in link of 8 GB/s can be held to its model for a flat window
 * of a large cache. A transfer that fits well in the cache is faster by memcpy, and its bytes
 * are where attention then reads them; pieces of 4 to 16 KiB scattered over a pool ran no faster
 * streamed (4.2 to 7.1 GB/s against 4.9 to 6.6). So only a transfer of STREAM_MIN_BYTES or more
 * in rows of STREAM_MIN_ROW or more is streamed.
 */
#include "device-copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_STREAM 1
#else
#define HAVE_STREAM 0
#endif

/* The row loops are left out of a coverage build's counters: a counter's update is a locked
 * instruction, which waits for the streamed stores before it, and made a 64 MiB copy take a second.
 * Not without optimization: GCC 12 at -O0 will not inline the SSE intrinsics (always_inline, and
 * counted) into a function left uncounted, and the build fails; such a build is not for timing. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#define NOT_PROFILED __attribute__((no_profile_instrument_function))
#else
#define NOT_PROFILED
#endif

#define STREAM_MIN_BYTES ((size_t) 4 << 20)
#define STREAM_MIN_ROW ((size_t) 16 << 10)

#if HAVE_STREAM
/* One row, streamed: the head up to 16-byte alignment and the tail by memcpy. */
NOT_PROFILED static void stream_row(char * dst, const char * src, size_t n) {
    const size_t head = (16 - ((uintptr_t) dst & 15)) & 15;
    memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *) (src + i));
        const __m128i b = _mm_loadu_si128((const __m128i *) (src + i + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *) (src + i + 32));
        const __m128i d = _mm_loadu_si128((const __m128i *) (src + i + 48));
        _mm_stream_si128((__m128i *) (dst + i), a);
        _mm_stream_si128((__m128i *) (dst + i + 16), b);
        _mm_stream_si128((__m128i *) (dst + i + 32), c);
        _mm_stream_si128((__m128i *) (dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
#endif

/* A short row in 16-byte moves the compiler inlines: a V-transposed block's rows are 32 bytes,
 * and a memcpy call each ran them at 3.2 to 5.5 GB/s here against 5.1 to 7.5 inline. */
#define SHORT_ROW 128
NOT_PROFILED static void short_row(char * dst, const char * src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        memcpy(dst + i, src + i, 16);
    }
    memmove(dst + i, src + i, n - i);
}

/* Do [a, a + n) and [b, b + n) share a byte? (a set from the device's own memory may.) */
static bool overlap(const char * a, const char * b, size_t n) {
    const uintptr_t x = (uintptr_t) a, y = (uintptr_t) b;
    return x < y + n && y < x + n;
}

/* The piece of a paced bulk transfer written before waiting for the link to carry it. */
#define PACE_BYTES ((size_t) 256 << 10)

void ferry_standin_copy_rows(char * dst, size_t dst_stride, const char * src, size_t src_stride, size_t size,
                             size_t rows, const link_slot * pace) {
    const bool bulk = size >= STREAM_MIN_ROW && size * rows >= STREAM_MIN_BYTES;
    bool streamed = false;
    size_t done = 0;
    for (size_t r = 0; r < rows; r++) {
        char * d = dst + r * dst_stride;
        const char * s = src + r * src_stride;
#if HAVE_STREAM
        if (bulk && !overlap(d, s, size)) {
            for (size_t at = 0; at < size; at += PACE_BYTES) {
                const size_t n = size - at < PACE_BYTES ? size - at : PACE_BYTES;
                stream_row(d + at, s + at, n);
                done += n;
                if (pace) {
                    ferry_link_pace(pace, done);
                }
            }
            streamed = true;
            continue;
        }
#endif
        if (size <= SHORT_ROW && !overlap(d, s, size)) {
            short_row(d, s, size);
        } else {
            memmove(d, s, size);
        }
    }
#if HAVE_STREAM
    if (streamed) {
        _mm_sfence(); /* streamed stores are weakly ordered: done before the link says so */
    }
#else
    (void) streamed, (void) bulk;
#endif
}

void ferry_standin_gather_rows(char * dst, const char * src, const ferry_gather_copy * pieces, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * c = &pieces[i];
        ferry_standin_copy_rows(dst + c->dst_offset, c->dst_stride, src + c->src_offset, c->src_stride, c->size,
                                c->count, NULL);
    }
}
