// CUDA graphs: the decode step of a batch-size bucket is captured once and replayed, so Python
// and launch overhead vanish in steady state. Buffers used inside a captured step must keep their
// addresses (the pool and the attention scratch do once warmed up by one uncaptured step).
#include <stdlib.h>

#include "cuda_common.cuh"

struct servd_cuda_graph {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
};

extern "C" int servd_cuda_graph_begin(servd_cuda_ctx *c) {
  // Thread-local: a call on this thread that cannot be captured (a host sync, cudaFree) fails the
  // capture instead of silently running now; other threads' captures and calls are unaffected.
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaStreamBeginCapture(servd__stream(c), cudaStreamCaptureModeThreadLocal));
  return SERVD_OK;
}

extern "C" int servd_cuda_graph_end(servd_cuda_ctx *c, servd_cuda_graph **out) {
  *out = NULL;
  // No early return before the capture ends: a failure to make the device current shows up as the
  // end-capture error below.
  servd__device_scope scope(servd_cuda_ctx_device(c));
  // The capture always ends here, even when it failed, so the stream is usable again.
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t err = cudaStreamEndCapture(servd__stream(c), &graph);
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGetLastError(); /* an invalidated capture leaves its error behind; later calls must not see it */
    if (graph) cudaGraphDestroy(graph);
    return servd_fail(SERVD_EDEVICE, "cuda graph capture: %s", cudaGetErrorString(err));
  }
  servd_cuda_graph *g = (servd_cuda_graph *)calloc(1, sizeof *g);
  if (!g) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return servd_fail(SERVD_ENOMEM, "cuda graph: out of host memory");
  }
  g->graph = graph;
  g->exec = exec;
  *out = g;
  return SERVD_OK;
}

extern "C" int servd_cuda_graph_launch(servd_cuda_ctx *c, servd_cuda_graph *g) {
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaGraphLaunch(g->exec, servd__stream(c)));
  return SERVD_OK;
}

extern "C" void servd_cuda_graph_destroy(servd_cuda_graph *g) {
  if (!g) return;
  cudaGraphExecDestroy(g->exec);
  cudaGraphDestroy(g->graph);
  free(g);
}
