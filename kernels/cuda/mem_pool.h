// Caching device allocator: sizes round up to power-of-two classes (256 B minimum, then 2 MiB
// granules above 32 MiB); freed blocks go to a per-class free list and are reused, so steady-state
// serving never calls cudaMalloc. Thread-safe.
#pragma once
#include <stddef.h>

typedef struct servd__cuda_pool servd__cuda_pool;
servd__cuda_pool *servd__cuda_pool_create(int device);
void servd__cuda_pool_destroy(servd__cuda_pool *p);
void *servd__cuda_pool_alloc(servd__cuda_pool *p, size_t bytes);
void servd__cuda_pool_free(servd__cuda_pool *p, void *ptr);
size_t servd__cuda_pool_reserved(const servd__cuda_pool *p);
