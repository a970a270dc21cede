/* What the CPU backend (this folder) gives other backends: its kernels, which the dummy
 * and stand-in devices compute with, and its 2-D transfers of host memory. */
#ifndef FERRY_CPU_IMPL_H
#define FERRY_CPU_IMPL_H

#include "graph-impl.h"

/* The CPU kernels (ops-cpu.c): compute one node whose tensors are in host memory. */
bool ferry_cpu_op_supported(const ferry_tensor * node);
ferry_status ferry_cpu_compute_node(ferry_tensor * node);
/* Decode attention on the CPU (ops-attn.c), dense or paged: the types it reads, and the kernel. */
bool ferry_cpu_attn_supported(const ferry_tensor * node);
ferry_status ferry_cpu_attn_decode(ferry_tensor * node);
/* The nodes of a graph in order, on the CPU kernels. */
ferry_status ferry_cpu_compute_graph(ferry_graph * graph);

/* A backend's 2-D transfers into memory the host writes (cpu-backend.c): the buffer's own
 * 2-D transfer, done now. */
ferry_status ferry_cpu_set_tensor_2d(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                     size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
ferry_status ferry_cpu_get_tensor_2d(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                     size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);

/* The host's memory (cpu-backend.c): MemAvailable of /proc/meminfo, else the available
 * pages, and the physical pages; UNSUPPORTED where the host says neither. The CPU backend's
 * answer, and that of the backends whose memory is the host's. */
ferry_status ferry_host_memory(size_t * free_bytes, size_t * total_bytes);

#endif
