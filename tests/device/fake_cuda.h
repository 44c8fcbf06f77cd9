/* A stand-in for the CUDA runtime and for servd's CUDA launchers (servd/cuda.h), on the host, for
 * running kernels/device/device_*.c (and everything above it: interpreters, engine) without a GPU.
 *
 * Device memory is host memory, but device work is deferred as on a GPU: every stream keeps a queue
 * of the work enqueued on it, which runs only when the host waits for that stream (a stream or event
 * synchronize, a copy to pageable host memory, cudaFree). So work that reads what another stream
 * wrote without a wait in between reads stale data, a pinned staging buffer overwritten before its
 * copy ran is copied with the new bytes, and a host read of device results without a wait misses
 * them: errors a synchronous stand-in would hide. Capture follows CUDA's thread-local mode: between
 * servd_cuda_graph_begin and _end the stream records its work instead of queuing it; a host wait, a
 * pageable copy or a cudaMalloc (outside relaxed mode) on the capturing thread invalidates the
 * capture and fails, and graph_end then fails. A launch queues the recorded work again, with the
 * pointers and sizes it was recorded with.
 *
 * Kernels compute in f32 from bf16 storage (matmul through the CPU kernels of servd/ops.h).
 * Collectives (servd_nccl_*) join the ranks of the process: outside a capture a rank's call blocks
 * until every rank made its own (as a host waiting in NCCL would); from a graph they meet when the
 * ranks' streams run. Test-only code.
 */
#ifndef SERVD_TEST_FAKE_CUDA_H
#define SERVD_TEST_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* Before the first CUDA call: n devices (default 1) of mem_bytes each (default 4 GiB). */
void fake_cuda_configure(int n_devices, size_t mem_bytes);

typedef struct fake_cuda_stats {
  uint64_t mallocs, frees; /* cudaMalloc / cudaFree that succeeded */
  uint64_t kernels;        /* launcher calls queued or recorded */
  uint64_t captures, capture_failures, graph_launches;
  uint64_t invalidations; /* captures invalidated by a call that cannot be captured */
  size_t device_bytes;    /* device memory allocated now (every device) */
  uint64_t h2d_bytes;     /* bytes copied host to device (cudaMemcpy*Async, HostToDevice) */
  int contexts;           /* servd_cuda_ctx alive (every thread's) */
} fake_cuda_stats;
void fake_cuda_get_stats(fake_cuda_stats *s);
/* Device memory of every device from now on (allocations beyond it fail as out of memory). */
void fake_cuda_set_memory(size_t mem_bytes);
/* The next n graph captures fail at their end, as when an op that cannot be captured ran. */
void fake_cuda_fail_captures(int n);
/* The next n kernel launches made while capturing fail (an error the forward sees mid-capture). */
void fake_cuda_fail_launches_in_capture(int n);
/* The next n graph launches fail. */
void fake_cuda_fail_graph_launches(int n);
/* The executor property (servd_device_executor_enabled): every stand-in entry point checks that it
 * runs on a device executor thread. mode 0: off; 1 (default): abort naming the call and the thread;
 * 2: count (fake_cuda_thread_violations). */
void fake_cuda_thread_check(int mode);
/* Calls made off an executor so far, and the first of them ("" when none). */
uint64_t fake_cuda_thread_violations(char *first, size_t cap);
/* Runs the queued work of every stream (as a device synchronize). */
void fake_cuda_flush_all(void);

#endif
