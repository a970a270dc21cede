/* What this build of the library contains. */
#include "ferry-impl.h"

#ifndef FERRY_VERSION
#define FERRY_VERSION "0.0.0"
#endif

#ifdef FERRY_WITH_CUDA
bool ferry_cuda_device_count_ok(void); /* cuda/ */
bool ferry_built_with_cuda(void) { return true; }
bool ferry_cuda_available(void) { return ferry_cuda_device_count_ok(); }
#else
bool ferry_built_with_cuda(void) { return false; }
bool ferry_cuda_available(void) { return false; }
#endif

#ifdef FERRY_FAKE_CUDART
bool ferry_built_with_fake_cudart(void) { return true; }
#else
bool ferry_built_with_fake_cudart(void) { return false; }
#endif

const char * ferry_version(void) { return FERRY_VERSION; }
size_t ferry_sizeof_tensor(void) { return sizeof(ferry_tensor); }
size_t ferry_sizeof_stats(void) { return sizeof(ferry_stats); }
