/* What the dummy backend (this folder) gives other backends. */
#ifndef FERRY_DUMMY_IMPL_H
#define FERRY_DUMMY_IMPL_H

#include "backend-impl.h"

/* A dummy backend under its own name that claims only the ops the CPU kernels do, so a
 * scheduler never gives it one it cannot run: the stand-in device (standin/). */
ferry_status ferry_dummy_backend_new_cpu_ops(const ferry_dummy_params * params, const char * name,
                                             ferry_backend ** out);

#endif
