/*
 * A window over a 2-stream KV cache in host memory, read by a node that runs on another
 * backend: the scheduler copies the window there under the ranges policy, one range per
 * stream, and counts the bytes. The dummy backend stands in for the device: its memory is
 * not the host's, so the window must be copied, and its copies are counted, not made.
 * Built against the installed library:
 *   cc window_ranges.c $(pkg-config --cflags --libs ferry) -o window_ranges
 * Prints the bytes copied against the window's span; exits 1 if a call fails.
 */
#include <ferry.h>

#include <inttypes.h>
#include <stdio.h>

#define TRY(expr)                                                                 \
    do {                                                                          \
        if ((expr) != FERRY_OK) {                                                 \
            fprintf(stderr, "window_ranges: %s: %s\n", #expr, ferry_last_error()); \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main(void) {
    /* one layer of 2 streams of 512 cells, K and V in f16, in the CPU's (host) memory */
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 64, .n_head_kv = 2,
                               .n_ctx = 1024, .n_stream = 2, .n_layer = 1};
    const int64_t n_kv = 100; /* the cells the sequence has: the window reads these of each stream */
    ferry_backend *cpu, *device;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_graph * graph;
    ferry_sched * sched;
    ferry_tensor *k, *v, *k_read;
    TRY(ferry_cpu_backend_new(&cpu));
    const ferry_dummy_params dp = ferry_dummy_default_params();
    TRY(ferry_dummy_backend_new(&dp, &device));
    TRY(ferry_kv_cache_new(&p, ferry_cpu_buffer_type(), &kv));
    TRY(ferry_context_new(&ctx));
    TRY(ferry_kv_cache_window(kv, ctx, 0, n_kv, 0, 1, &k, &v));
    TRY(ferry_dup(ctx, k, &k_read)); /* a node on the device that reads K's window */
    TRY(ferry_tensor_set_output(k_read));
    TRY(ferry_graph_new(&graph));
    TRY(ferry_graph_build(graph, k_read));
    ferry_backend * backends[2] = {device, cpu};
    TRY(ferry_sched_new(backends, 2, &sched));
    TRY(ferry_sched_set_policy(sched, FERRY_COPY_RANGES));
    TRY(ferry_sched_set_tensor_backend(sched, k_read, device));
    TRY(ferry_sched_graph_compute(sched, graph));
    ferry_sched_stats st;
    TRY(ferry_sched_get_stats(sched, &st));
    const char * policy = ferry_copy_policy_name(ferry_sched_get_policy(sched));
    printf("%s: %" PRIu64 " input(s), %" PRIu64 " bytes copied in %" PRIu64 " call(s) of a %" PRIu64
           "-byte span (%" PRIu64 " bytes read)\n",
           policy, st.n_inputs, st.bytes_copied, st.copy_calls, st.bytes_span, st.bytes_read);
    ferry_sched_free(sched);
    ferry_graph_free(graph);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
    ferry_backend_free(device);
    ferry_backend_free(cpu);
    return 0;
}
