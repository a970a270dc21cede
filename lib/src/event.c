/* Events: public checks and dispatch; a backend makes them through its event_new. */
#include "ferry-impl.h"

#include <stdlib.h>
#include <time.h>

double ferry_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

ferry_status ferry_event_new(ferry_backend * backend, uint32_t flags, ferry_event ** out) {
    FERRY_CHECK_ARG(backend && out, "event_new: NULL backend or output");
    FERRY_CHECK_ARG((flags & ~(uint32_t) FERRY_EVENT_TIMING) == 0, "event_new: unknown flags 0x%x", (unsigned) flags);
    if (!backend->iface.event_new) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "event_new: backend %s has no events", ferry_backend_name(backend));
    }
    return backend->iface.event_new(backend, flags, out);
}

void ferry_event_free(ferry_event * event) {
    if (!event) {
        return;
    }
    if (event->iface.free) {
        event->iface.free(event);
    }
    free(event);
}

ferry_status ferry_event_record(ferry_event * event, ferry_backend * backend) {
    FERRY_CHECK_ARG(event && backend, "event_record: NULL event or backend");
    return event->iface.record(event, backend);
}

ferry_status ferry_event_wait(ferry_backend * backend, ferry_event * event) {
    FERRY_CHECK_ARG(event && backend, "event_wait: NULL event or backend");
    const ferry_status st = event->iface.wait(backend, event);
    if (st != FERRY_ERR_UNSUPPORTED) {
        return st;
    }
    /* A backend that cannot wait on the device waits here: correct, only slower. */
    ferry_clear_error();
    return event->iface.synchronize(event);
}

ferry_status ferry_event_synchronize(ferry_event * event) {
    FERRY_CHECK_ARG(event, "event_synchronize: NULL event");
    return event->iface.synchronize(event);
}

ferry_status ferry_event_elapsed_ms(const ferry_event * start, const ferry_event * end, float * out) {
    FERRY_CHECK_ARG(start && end && out, "event_elapsed_ms: NULL argument");
    if (!start->iface.elapsed_ms || start->iface.elapsed_ms != end->iface.elapsed_ms) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "event_elapsed_ms: these events cannot be timed against each other");
    }
    return start->iface.elapsed_ms(start, end, out);
}

ferry_status ferry_event_reached_seconds(const ferry_event * event, double * out) {
    FERRY_CHECK_ARG(event && out, "event_reached_seconds: NULL argument");
    if (!event->iface.reached_seconds) {
        return FERRY_ERR_UNSUPPORTED;
    }
    return event->iface.reached_seconds(event, out);
}
