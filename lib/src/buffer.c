/* Buffer types and buffers: public dispatch, the live-buffer registry, counters. */
#include "ferry-impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- live buffers
 * Tensors remember their buffer's serial; a freed buffer's serial leaves this set,
 * so a tensor in a freed buffer is refused without touching the freed struct. */

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t * live_ids;
static size_t n_live, live_capacity;
static _Atomic uint64_t next_id = 1;

static bool live_add(uint64_t id) {
    pthread_mutex_lock(&live_lock);
    uint64_t * grown = ferry_grow(live_ids, &live_capacity, n_live + 1, sizeof(*grown));
    const bool ok = grown != NULL;
    if (ok) {
        live_ids = grown;
        live_ids[n_live++] = id;
    }
    pthread_mutex_unlock(&live_lock);
    return ok;
}

static void live_remove(uint64_t id) {
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < n_live; i++) {
        if (live_ids[i] == id) {
            live_ids[i] = live_ids[--n_live];
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

bool ferry_buffer_id_is_live(uint64_t id) {
    bool found = false;
    pthread_mutex_lock(&live_lock);
    for (size_t i = 0; i < n_live && !found; i++) {
        found = live_ids[i] == id;
    }
    pthread_mutex_unlock(&live_lock);
    return found;
}

/* A tensor's memory is usable while its buffer's serial is live: the check is the buffers'
 * to make, since they keep the registry. */
ferry_status ferry_tensor_check_allocated(const ferry_tensor * t) {
    FERRY_CHECK_ARG(t, "NULL tensor");
    const ferry_tensor * root = ferry_tensor_root(t);
    if (!root->buffer) {
        return ferry_fail(FERRY_ERR_NOT_ALLOCATED, "tensor '%s' is not allocated", t->name);
    }
    if (!ferry_buffer_id_is_live(root->buffer_id)) {
        return ferry_fail(FERRY_ERR_FREED, "tensor '%s' lies in a buffer that was freed", t->name);
    }
    ferry_tensor_data(t);
    return FERRY_OK;
}

/* ---------------------------------------------------------------- counters */

const char * ferry_xfer_name(ferry_xfer kind) {
    static const char * const names[FERRY_XFER_COUNT] = {"set", "get", "set_2d", "get_2d", "copy", "memset"};
    if ((int) kind < 0 || kind >= FERRY_XFER_COUNT) {
        ferry_fail(FERRY_ERR_INVALID_ARG, "unknown transfer kind %d", (int) kind);
        return NULL;
    }
    return names[kind];
}

void ferry_stats_add(ferry_stats * s, ferry_xfer kind, uint64_t bytes, uint64_t impl_calls) {
    s->calls[kind] += 1;
    s->bytes[kind] += bytes;
    s->impl_calls[kind] += impl_calls;
}

/* ---------------------------------------------------------------- buffer types */

const char * ferry_buffer_type_name(const ferry_buffer_type * buft) {
    return buft ? buft->iface.get_name(buft) : NULL;
}

ferry_status ferry_buffer_type_alloc_buffer(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    FERRY_CHECK_ARG(buft && out, "alloc_buffer: NULL buffer type or output");
    if (size > (size_t) INT64_MAX) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "alloc_buffer: size %zu is not a valid size", size);
    }
    const size_t max_size = ferry_buffer_type_max_size(buft);
    if (size > max_size) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "alloc_buffer: %zu bytes exceed %s's max buffer size %zu",
                          size, ferry_buffer_type_name(buft), max_size);
    }
    return buft->iface.alloc_buffer(buft, size, out);
}

size_t ferry_buffer_type_alignment(const ferry_buffer_type * buft) {
    return buft ? buft->iface.get_alignment(buft) : 0;
}

size_t ferry_buffer_type_max_size(const ferry_buffer_type * buft) {
    if (!buft) {
        return 0;
    }
    return buft->iface.get_max_size ? buft->iface.get_max_size(buft) : SIZE_MAX;
}

bool ferry_buffer_type_is_host(const ferry_buffer_type * buft) { return buft && buft->iface.is_host(buft); }

size_t ferry_buffer_type_alloc_size(const ferry_buffer_type * buft, const ferry_tensor * t) {
    if (!buft || !t) {
        return 0;
    }
    return buft->iface.get_alloc_size ? buft->iface.get_alloc_size(buft, t) : ferry_tensor_nbytes(t);
}

/* ---------------------------------------------------------------- buffers */

ferry_status ferry_buffer_init(ferry_buffer_type * buft, struct ferry_buffer_i iface, void * context,
                               size_t size, ferry_buffer ** out) {
    ferry_buffer * buf = ferry_calloc(1, sizeof(*buf));
    if (!buf) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "buffer: out of memory");
    }
    buf->iface = iface;
    buf->buft = buft;
    buf->context = context;
    buf->size = size;
    buf->id = atomic_fetch_add(&next_id, 1);
    if (!live_add(buf->id)) {
        free(buf);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "buffer: out of memory");
    }
    *out = buf;
    return FERRY_OK;
}

void ferry_buffer_free(ferry_buffer * buf) {
    if (!buf) {
        return;
    }
    live_remove(buf->id);
    if (buf->iface.free_buffer) {
        buf->iface.free_buffer(buf);
    }
    free(buf);
}

void * ferry_buffer_base(const ferry_buffer * buf) { return buf ? buf->iface.get_base(buf) : NULL; }
size_t ferry_buffer_size(const ferry_buffer * buf) { return buf ? buf->size : 0; }
ferry_buffer_type * ferry_buffer_get_type(const ferry_buffer * buf) { return buf ? buf->buft : NULL; }
bool ferry_buffer_is_host(const ferry_buffer * buf) { return buf && ferry_buffer_type_is_host(buf->buft); }

bool ferry_buffer_is_synthetic(const ferry_buffer * buf) {
    return buf && buf->buft->iface.is_synthetic && buf->buft->iface.is_synthetic(buf->buft);
}

bool ferry_buffer_memory(const ferry_buffer * buf, ferry_memory_kind * kind, int * device) {
    if (!buf || ferry_buffer_is_synthetic(buf)) {
        return false;
    }
    if (buf->buft->iface.get_memory) {
        return buf->buft->iface.get_memory(buf->buft, kind, device);
    }
    if (!ferry_buffer_is_host(buf)) {
        return false;
    }
    *kind = FERRY_MEMORY_HOST;
    *device = -1;
    return true;
}

bool ferry_buffer_ptr_readable(const ferry_buffer * src, const ferry_buffer * dst) {
    return ferry_buffer_is_host(src) && (!ferry_buffer_is_synthetic(src) || ferry_buffer_is_synthetic(dst));
}

bool ferry_buffer_ptr_writable(const ferry_buffer * dst, const ferry_buffer * src) {
    return ferry_buffer_is_host(dst) && ferry_buffer_is_synthetic(dst) == ferry_buffer_is_synthetic(src);
}
uint64_t ferry_buffer_id(const ferry_buffer * buf) { return buf ? buf->id : 0; }

ferry_status ferry_buffer_set_usage(ferry_buffer * buf, ferry_buffer_usage usage) {
    FERRY_CHECK_ARG(buf, "set_usage: NULL buffer");
    FERRY_CHECK_ARG(usage >= FERRY_BUFFER_USAGE_ANY && usage <= FERRY_BUFFER_USAGE_COMPUTE,
                    "set_usage: unknown usage %d", (int) usage);
    buf->usage = usage;
    return FERRY_OK;
}

ferry_buffer_usage ferry_buffer_get_usage(const ferry_buffer * buf) {
    return buf ? buf->usage : FERRY_BUFFER_USAGE_ANY;
}

ferry_status ferry_buffer_clear(ferry_buffer * buf, uint8_t value) {
    FERRY_CHECK_ARG(buf, "clear: NULL buffer");
    FERRY_TRY(buf->iface.clear(buf, value));
    ferry_stats_add(&buf->stats, FERRY_XFER_MEMSET, buf->size, 1);
    return FERRY_OK;
}

ferry_status ferry_buffer_place_tensor(ferry_buffer * buf, ferry_tensor * t, size_t offset) {
    FERRY_CHECK_ARG(buf && t, "place_tensor: NULL buffer or tensor");
    if (t->view_src) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "place_tensor: '%s' is a view; it takes its source's memory", t->name);
    }
    const size_t align = ferry_buffer_type_alignment(buf->buft);
    if (align && offset % align != 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "place_tensor: offset %zu is not a multiple of the alignment %zu",
                          offset, align);
    }
    const size_t need = ferry_buffer_type_alloc_size(buf->buft, t);
    size_t end;
    if (!ferry_add_ok(offset, need, &end) || end > buf->size) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "place_tensor: '%s' needs %zu bytes at offset %zu of a %zu-byte buffer",
                          t->name, need, offset, buf->size);
    }
    t->buffer = buf;
    t->buffer_id = buf->id;
    t->data = (char *) ferry_buffer_base(buf) + offset;
    return FERRY_OK;
}

ferry_status ferry_stats_get(const ferry_stats * s, ferry_stats * out) {
    FERRY_CHECK_ARG(s && out, "get_stats: NULL argument");
    *out = *s;
    return FERRY_OK;
}

void ferry_stats_reset(ferry_stats * s) {
    if (s) {
        memset(s, 0, sizeof(*s));
    }
}

ferry_status ferry_buffer_get_stats(const ferry_buffer * buf, ferry_stats * out) {
    return ferry_stats_get(buf ? &buf->stats : NULL, out);
}

void ferry_buffer_reset_stats(ferry_buffer * buf) { ferry_stats_reset(buf ? &buf->stats : NULL); }
