/* Internal interfaces of graphs and ops (graph.c, ops.c), for the allocator and the
 * backends. */
#ifndef FERRY_GRAPH_IMPL_H
#define FERRY_GRAPH_IMPL_H

#include "backend-impl.h"

#ifdef __cplusplus
extern "C" { /* the CUDA kernels' checks (ops-cuda.cu) */
#endif

/* Views compute nothing: their memory is their source's. */
bool ferry_op_is_view(ferry_op op);
/* An attn_paged node's values checked before a kernel reads the pools (ops.c): each stream's
 * length (clamped) at least q's tokens or 0, and every table entry it reaches a slot of the pools;
 * OUT_OF_BOUNDS naming the stream (and the entry) otherwise. kv_len and table are the bytes of
 * src[3] and src[4] at their strides, wherever the backend has them read to. */
ferry_status ferry_attn_paged_check(const ferry_tensor * node, const void * kv_len, const void * table);
/* Ops whose result may take the memory of src[0] (same layout, elementwise). */
bool ferry_op_can_inplace(ferry_op op);

/* Every tensor of a graph has a slot, 0..n_slots-1, stable while the graph grows;
 * -1 for a tensor not in the graph. The allocator keeps its per-tensor state by slot. */
int ferry_graph_n_slots(const ferry_graph * graph);
int ferry_graph_slot(const ferry_graph * graph, const ferry_tensor * t);
/* Append t as a node, its sources not added (a split's nodes). */
ferry_status ferry_graph_add_node(ferry_graph * graph, ferry_tensor * t);

/* The one check of an attention node's lengths against its query tokens (ops.c): each stream's
 * length, clamped to 0..n_kv, 0 or at least n_tok; refused naming `what`, the node, the stream,
 * its length and n_tok. kv_len must lie in memory the host reads by pointer. The CPU kernel makes
 * it as it runs, the scheduler before a run moves a byte. */
ferry_status ferry_attn_check_lengths(const ferry_tensor * node, const char * what);

#ifdef __cplusplus
}
#endif

#endif
