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

/* With executors a capture runs on the device's executor thread (CUDA's thread-local capture mode is
 * that thread's), and the calling thread owns the device's queue until graph_end, so no other
 * thread's work lands in its graph. */
typedef struct graph_begin_args {
  int device;
} graph_begin_args;
SERVD__DEV_JOB(graph_begin, servd_device_graph_begin(a->device))
typedef struct graph_end_args {
  int device;
  servd_device_graph **out;
} graph_end_args;
SERVD__DEV_JOB(graph_end, servd_device_graph_end(a->device, a->out))
static int launch_now(servd_device_graph *g);
/* The generation was checked when the launch was queued: memory released after that is only reused
 * by work queued after it. */
typedef struct graph_launch_args {
  servd_device_graph *g;
} graph_launch_args;
SERVD__DEV_JOB(graph_launch, launch_now(a->g))
typedef struct graph_destroy_args {
  servd_device_graph *g;
} graph_destroy_args;
SERVD__DEV_JOB(graph_destroy, (servd_device_graph_destroy(a->g), 0))

int servd_device_graph_begin(int device) {
  const char *op = "device_graph_begin";
  if (servd__dev_forwarding()) {
    int rc = servd__dev_valid(op, device);
    if (!rc) rc = servd__dev_claim(op, device);
    if (rc) return rc;
    graph_begin_args a = {device};
    rc = servd__dev_forward(op, device, graph_begin_job, &a, sizeof a, SERVD__DEV_WAIT, NULL, 0);
    if (rc) servd__dev_unclaim(device);
    return rc;
  }
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
  if (servd__dev_forwarding()) {
    if (device < 0 || device >= MAX_DEVICES) return servd_fail(SERVD_EINVAL, "%s: device %d", op, device);
    /* Always runs: the stream must leave capture mode even after an op in it failed. */
    graph_end_args a = {device, out};
    int rc = servd__dev_forward(op, device, graph_end_job, &a, sizeof a, SERVD__DEV_WAIT | SERVD__DEV_ALWAYS, NULL, 0);
    servd__dev_unclaim(device);
    if (rc && *out) { /* an op of the capture failed: the graph is not whole */
      servd_device_graph_destroy(*out);
      *out = NULL;
    }
    return rc;
  }
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
  if (servd__dev_forwarding()) {
    graph_launch_args a = {g};
    return servd__dev_forward(op, g->device, graph_launch_job, &a, sizeof a, 0, NULL, 0);
  }
  return launch_now(g);
}

static int launch_now(servd_device_graph *g) {
  const char *op = "device_graph_launch";
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx(op, g->device, &c);
  if (rc) return rc;
  return servd__dev_wrap(servd_cuda_graph_launch(c, g->graph), op);
}

void servd_device_graph_destroy(servd_device_graph *g) {
  if (!g) return;
  if (servd__dev_forwarding()) { /* after the launches queued before it */
    graph_destroy_args a = {g};
    servd__dev_forward("device_graph_destroy", g->device, graph_destroy_job, &a, sizeof a,
                       SERVD__DEV_ALWAYS | SERVD__DEV_KEEP, NULL, 0);
    return;
  }
  servd_cuda_graph_destroy(g->graph);
  servd__dev_capture_release(g->cap);
  free(g);
}
