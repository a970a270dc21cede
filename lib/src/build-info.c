/* What this build of the library contains. */
#include "ferry-impl.h"

#ifndef FERRY_VERSION
#define FERRY_VERSION "0.0.0"
#endif

/* Whether a device is usable now is the CUDA backend's to say (cuda/). */
#ifdef FERRY_WITH_CUDA
bool ferry_built_with_cuda(void) { return true; }
#else
bool ferry_built_with_cuda(void) { return false; }
#endif

#ifdef FERRY_FAKE_CUDART
bool ferry_built_with_fake_cudart(void) { return true; }
#else
bool ferry_built_with_fake_cudart(void) { return false; }
#endif

const char * ferry_version(void) { return FERRY_VERSION; }
size_t ferry_sizeof_tensor(void) { return sizeof(ferry_tensor); }
size_t ferry_sizeof_stats(void) { return sizeof(ferry_stats); }
