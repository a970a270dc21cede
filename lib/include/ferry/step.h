/* ferry/step.h: a decode step's attention, built in one call. */
#ifndef FERRY_STEP_H
#define FERRY_STEP_H

#include "kv.h"
#include "paged.h"
#include "sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- a decode step (step-graph.c) */

/*
 * Per layer l of 0..n_layer-1, what ferry_kv_cache_window and ferry_attn_decode make one
 * layer at a time, in one call (a caller in Python pays one crossing a step, not several
 * a layer): the K and V windows of cells 0..n_kv-1 of streams s0..s1, made in ctx;
 * decode attention over them of q[l] and kv_len, scale 1/sqrt(q[l]'s head_dim), made in
 * ctx, named "attn<l>" and marked output, its windows carrying kv_len as their used cells
 * (ferry_tensor_set_used_cells, limit n_kv: what the ragged policy copies, so kv_len must then
 * be in host memory); then each output assigned to backend on sched
 * (ferry_sched_set_tensor_backend) and built into graph in layer order. outs[l] is
 * layer l's output; outs is written only on success.
 *
 * Layers of different sizes: a layer holding W cells per stream (a sliding-window layer,
 * ferry_kv_cache_new_layers) gets the window of its first min(n_kv, W) cells
 * (ferry_kv_cache_layer_n_kv), and attention, which clamps each stream's kv_len to its
 * window, reads min(kv_len[s], W) of them: all the sliding layer holds of a longer
 * sequence, in whatever order it keeps them (attention does not depend on the cells' order).
 *
 * Refused (FERRY_ERR_INVALID_ARG, FERRY_ERR_OUT_OF_BOUNDS, FERRY_ERR_LAYOUT, with a
 * message naming the layer): NULL arguments or queries, n_layer not in 1..the cache's
 * layers, n_kv not in 1..a full layer's cells (ferry_kv_cache_kv_size), streams the cache
 * does not have, a v_trans other than the cache's (ferry_kv_params.v_trans), shapes attention
 * cannot read, a backend not the scheduler's. Every window and node is made before the first assignment and the graph is
 * built after the last, so a refused argument assigns nothing and leaves graph as it was;
 * what was made stays in ctx. Only running out of memory part way through the assignments or
 * the graph leaves some assignments (clear them before freeing ctx) or part of the step in graph.
 */
FERRY_API ferry_status ferry_kv_attention_step(const ferry_kv_cache * kv, ferry_context * ctx, int32_t n_layer, int64_t n_kv,
                                     int64_t s0, int64_t s1, ferry_tensor * const * q, ferry_tensor * kv_len,
                                     bool v_trans, ferry_sched * sched, ferry_backend * backend, ferry_graph * graph,
                                     ferry_tensor ** outs);

/*
 * ferry_kv_attention_step with a backend per layer: layer l's output is assigned to
 * backends[l] (n_layer of them), so that the step runs on several devices; the scheduler
 * makes a split per run of layers on one backend and copies what a layer reads from
 * elsewhere (its windows, its q, kv_len) into its split. Every backend is checked before
 * anything is made: a NULL one or one not the scheduler's is refused (FERRY_ERR_INVALID_ARG,
 * naming the layer). Otherwise as ferry_kv_attention_step, which is this with one backend
 * for every layer.
 */
FERRY_API ferry_status ferry_kv_attention_step_on(const ferry_kv_cache * kv, ferry_context * ctx, int32_t n_layer,
                                                  int64_t n_kv, int64_t s0, int64_t s1, ferry_tensor * const * q,
                                                  ferry_tensor * kv_len, bool v_trans, ferry_sched * sched,
                                                  ferry_backend * const * backends, ferry_graph * graph,
                                                  ferry_tensor ** outs);

/*
 * ferry_kv_attention_step_on over a paged cache: layer l's windows are its paged windows of
 * n_kv cells of sequences s0..s1 (ferry_paged_cache_window), carrying kv_len as their used cells
 * (limit n_kv), so that a split gathers each sequence's first kv_len cells into dense windows and
 * attention reads them unchanged. Refused as ferry_kv_attention_step_on, n_kv not in 1..a pool's
 * cells (n_blocks * block_size).
 */
FERRY_API ferry_status ferry_paged_attention_step_on(const ferry_paged_cache * cache, ferry_context * ctx,
                                                     int32_t n_layer, int64_t n_kv, int64_t s0, int64_t s1,
                                                     ferry_tensor * const * q, ferry_tensor * kv_len, bool v_trans,
                                                     ferry_sched * sched, ferry_backend * const * backends,
                                                     ferry_graph * graph, ferry_tensor ** outs);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_STEP_H */
