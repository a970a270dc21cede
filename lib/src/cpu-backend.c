/* The CPU backend and the host buffer type it allocates from. */
#include "graph-impl.h"

#include <stdint.h>

#define FERRY_CPU_ALIGNMENT 64

static const char * cpu_buft_name(const ferry_buffer_type * buft) {
    (void) buft;
    return "CPU";
}

static ferry_status cpu_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    return ferry_host_buffer_new(buft, size, FERRY_CPU_ALIGNMENT, out);
}

static size_t cpu_buft_alignment(const ferry_buffer_type * buft) {
    (void) buft;
    return FERRY_CPU_ALIGNMENT;
}

static bool cpu_buft_is_host(const ferry_buffer_type * buft) {
    (void) buft;
    return true;
}

static ferry_buffer_type cpu_buffer_type = {
    .iface = {
        .get_name = cpu_buft_name,
        .alloc_buffer = cpu_buft_alloc,
        .get_alignment = cpu_buft_alignment,
        .is_host = cpu_buft_is_host,
    },
};

ferry_buffer_type * ferry_cpu_buffer_type(void) { return &cpu_buffer_type; }

static const char * cpu_name(const ferry_backend * backend) {
    (void) backend;
    return "CPU";
}

static ferry_buffer_type * cpu_default_buft(ferry_backend * backend) {
    (void) backend;
    return &cpu_buffer_type;
}

/* Any host memory will do, pinned host buffers of other backends included. */
static bool cpu_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    (void) backend;
    return ferry_buffer_type_is_host(buft);
}

/* Host memory: a 2-D transfer is the buffer's own row loop, done now. */
static ferry_status cpu_set_2d(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                               size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) backend;
    ferry_buffer * buf = ferry_tensor_buffer(t);
    return buf->iface.set_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data);
}

static ferry_status cpu_get_2d(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                               size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) backend;
    ferry_buffer * buf = ferry_tensor_buffer(t);
    return buf->iface.get_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data);
}

static bool cpu_supports_op(ferry_backend * backend, const ferry_tensor * op) {
    (void) backend;
    return ferry_cpu_op_supported(op);
}

static ferry_status cpu_graph_compute(ferry_backend * backend, ferry_graph * graph) {
    (void) backend;
    return ferry_cpu_compute_graph(graph);
}

ferry_status ferry_cpu_backend_new(ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "cpu_backend_new: NULL output");
    const struct ferry_backend_i iface = {
        .get_name = cpu_name,
        .get_default_buffer_type = cpu_default_buft,
        .supports_buft = cpu_supports_buft,
        .supports_op = cpu_supports_op,
        .set_tensor_2d_async = cpu_set_2d,
        .get_tensor_2d_async = cpu_get_2d,
        .graph_compute = cpu_graph_compute,
    };
    return ferry_backend_init(iface, NULL, out);
}
