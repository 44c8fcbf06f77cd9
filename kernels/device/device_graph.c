/* CUDA graphs of the work one thread enqueues on one device: capture, replay, drop. The memory the
 * capture allocates stays reserved for the graph until it is destroyed (device_memory.c). */
#include <stdlib.h>

#include "device_internal.h"

#define MAX_DEVICES 64

struct servd_device_graph {
  int device;
  uint64_t generation; /* at the end of the capture; replaying after a change is refused */
  servd_cuda_graph *graph;
  servd__dev_capture *cap;
};

static _Thread_local servd__dev_capture *open_cap[MAX_DEVICES];

int servd_device_graph_begin(int device) {
  const char *op = "device_graph_begin";
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  if (open_cap[device]) return servd_fail(SERVD_EINVAL, "%s: this thread already captures on cuda:%d", op, device);
  servd__dev_capture *cap;
  rc = servd__dev_capture_start(device, &cap);
  if (rc) return rc;
  rc = servd_cuda_graph_begin(c);
  if (rc) {
    servd__dev_capture_stop(device);
    servd__dev_capture_release(cap);
    return servd__dev_wrap(rc, op);
  }
  open_cap[device] = cap;
  return SERVD_OK;
}

int servd_device_graph_end(int device, servd_device_graph **out) {
  const char *op = "device_graph_end";
  *out = NULL;
  if (device < 0 || device >= MAX_DEVICES || !open_cap[device])
    return servd_fail(SERVD_EINVAL, "%s: this thread is not capturing on cuda:%d", op, device);
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  servd__dev_capture *cap = open_cap[device];
  open_cap[device] = NULL;
  servd_cuda_graph *cg = NULL;
  rc = servd_cuda_graph_end(c, &cg);
  servd__dev_capture_stop(device);
  servd_device_graph *g = rc ? NULL : calloc(1, sizeof *g);
  if (!g) {
    if (!rc) rc = servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
    servd_cuda_graph_destroy(cg);
    servd__dev_capture_release(cap);
    return servd__dev_wrap(rc, op);
  }
  g->device = device;
  g->generation = servd_cuda_generation(device);
  g->graph = cg;
  g->cap = cap;
  *out = g;
  return SERVD_OK;
}

int servd_device_graph_launch(servd_device_graph *g) {
  const char *op = "device_graph_launch";
  if (!g) return servd_fail(SERVD_EINVAL, "%s: NULL graph", op);
  if (servd_cuda_generation(g->device) != g->generation)
    return servd_fail(SERVD_ECANCELED,
                      "%s: device memory on cuda:%d changed since the capture (generation %llu, now "
                      "%llu): capture again",
                      op, g->device, (unsigned long long)g->generation,
                      (unsigned long long)servd_cuda_generation(g->device));
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx(op, g->device, &c);
  if (rc) return rc;
  return servd__dev_wrap(servd_cuda_graph_launch(c, g->graph), op);
}

void servd_device_graph_destroy(servd_device_graph *g) {
  if (!g) return;
  servd_cuda_graph_destroy(g->graph);
  servd__dev_capture_release(g->cap);
  free(g);
}
