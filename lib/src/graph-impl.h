/* Internal interfaces of graphs and ops (graph.c, ops.c, ops-cpu.c), for the
 * allocator and the backends. */
#ifndef FERRY_GRAPH_IMPL_H
#define FERRY_GRAPH_IMPL_H

#include "ferry-impl.h"

/* Views compute nothing: their memory is their source's. */
bool ferry_op_is_view(ferry_op op);
/* Ops whose result may take the memory of src[0] (same layout, elementwise). */
bool ferry_op_can_inplace(ferry_op op);

/* Every tensor of a graph has a slot, 0..n_slots-1, stable while the graph grows;
 * -1 for a tensor not in the graph. The allocator keeps its per-tensor state by slot. */
int ferry_graph_n_slots(const ferry_graph * graph);
int ferry_graph_slot(const ferry_graph * graph, const ferry_tensor * t);
/* Append t as a node, its sources not added (a split's nodes). */
ferry_status ferry_graph_add_node(ferry_graph * graph, ferry_tensor * t);

/* The CPU kernels: compute one node whose tensors are in host memory. */
bool ferry_cpu_op_supported(const ferry_tensor * node);
ferry_status ferry_cpu_compute_node(ferry_tensor * node);
/* Decode attention on the CPU (ops-attn.c): the types it reads, and the kernel. */
bool ferry_cpu_attn_supported(const ferry_tensor * node);
ferry_status ferry_cpu_attn_decode(ferry_tensor * node);
/* The nodes of a graph in order, on the CPU kernels (the CPU and dummy backends). */
ferry_status ferry_cpu_compute_graph(ferry_graph * graph);

/* A dummy backend (dummy-backend.c) under its own name that claims only the ops the CPU
 * kernels do, so a scheduler never gives it one it cannot run: the stand-in device. */
ferry_status ferry_dummy_backend_new_cpu_ops(const ferry_dummy_params * params, const char * name,
                                             ferry_backend ** out);

#endif
