/* The allocation-failure hook of test builds (alloc-hook.h); compiled only with
 * -Dfault_injection=true. Counters are atomic: tests may allocate from several threads. */
#include "alloc-hook.h"

#include <stdatomic.h>

static atomic_long armed_at;  /* the allocation that fails, counted from the arm; 0: none */
static atomic_long made;      /* allocations since the arm */
static atomic_bool fired;

void ferry_fault_alloc_arm(long n) {
    atomic_store(&armed_at, 0);
    atomic_store(&made, 0);
    atomic_store(&fired, false);
    atomic_store(&armed_at, n > 0 ? n : 0);
}

bool ferry_fault_alloc_fails(void) {
    const long k = atomic_fetch_add(&made, 1) + 1;
    if (k == atomic_load(&armed_at)) {
        atomic_store(&fired, true);
        return true;
    }
    return false;
}

long ferry_fault_alloc_count(void) { return atomic_load(&made); }
bool ferry_fault_alloc_fired(void) { return atomic_load(&fired); }
