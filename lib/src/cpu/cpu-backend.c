/* The CPU backend: the CPU kernels over host memory (the generic host buffer type). */
#include "cpu-impl.h"

#include <stdio.h>
#include <unistd.h>

ferry_buffer_type * ferry_cpu_buffer_type(void) { return ferry_host_buffer_type(); }

static const char * cpu_name(const ferry_backend * backend) {
    (void) backend;
    return "CPU";
}

static ferry_buffer_type * cpu_default_buft(ferry_backend * backend) {
    (void) backend;
    return ferry_host_buffer_type();
}

/* Any host memory will do, pinned host buffers of other backends included. */
static bool cpu_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    (void) backend;
    return ferry_buffer_type_is_host(buft);
}

/* Memory the host writes: a 2-D transfer is the buffer's own, done now. */
ferry_status ferry_cpu_set_tensor_2d(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                     size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) backend;
    ferry_buffer * buf = ferry_tensor_buffer(t);
    return buf->iface.set_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data);
}

ferry_status ferry_cpu_get_tensor_2d(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
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

/* MemAvailable counts the page cache the kernel would give back, which the free pages
 * (_SC_AVPHYS_PAGES) leave out; read it where /proc has it. */
static bool mem_available(size_t * out) {
    FILE * f = fopen("/proc/meminfo", "r");
    if (!f) {
        return false;
    }
    char line[128];
    bool found = false;
    unsigned long long kib = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    }
    fclose(f);
    if (found) {
        *out = (size_t) kib * 1024;
    }
    return found;
}

ferry_status ferry_host_memory(size_t * free_bytes, size_t * total_bytes) {
    const long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || pages <= 0) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "host memory: the host does not say how much it has");
    }
    *total_bytes = (size_t) pages * (size_t) page;
    if (!mem_available(free_bytes)) {
        const long avail = sysconf(_SC_AVPHYS_PAGES);
        *free_bytes = avail > 0 ? (size_t) avail * (size_t) page : 0;
    }
    if (*free_bytes > *total_bytes) {
        *free_bytes = *total_bytes;
    }
    return FERRY_OK;
}

static ferry_status cpu_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    (void) backend;
    return ferry_host_memory(free_bytes, total_bytes);
}

ferry_status ferry_cpu_backend_new(ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "cpu_backend_new: NULL output");
    const struct ferry_backend_i iface = {
        .get_name = cpu_name,
        .get_default_buffer_type = cpu_default_buft,
        .supports_buft = cpu_supports_buft,
        .supports_op = cpu_supports_op,
        .set_tensor_2d_async = ferry_cpu_set_tensor_2d,
        .get_tensor_2d_async = ferry_cpu_get_tensor_2d,
        .graph_compute = cpu_graph_compute,
        .get_memory = cpu_get_memory,
    };
    return ferry_backend_init(iface, NULL, out);
}
