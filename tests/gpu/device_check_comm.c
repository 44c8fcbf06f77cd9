/* The NCCL collectives of servd/device.h: one rank always, two ranks when two GPUs are visible. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_check.h"

enum { C_M = 5, C_N = 1001 }; /* N odd: ranks get ceil(N/world) columns, the last one fewer */

/* Values of rank r's reduce input and of its logits shard (column c of the full (M, N) matrix). */
static float reduce_value(int r, size_t i) { return dc_round_bf16(sinf((float)(i * 7 + r * 1000 + 1)) * 2.f); }
static float gather_value(int row, int col) { return (float)(row * 100000 + col) + 0.25f; }

typedef struct rank_job {
  servd_device_comm *comm;
  int rank, world, device;
  int rc;
  char err[256];
  float *reduced;  /* (M, N) after allreduce */
  float *gathered; /* (M, N) after allgather_cols */
} rank_job;

/* One rank's part: allreduce of its bf16 (M, N), allgather of its f32 (M, n_r) columns. */
static void *rank_main(void *arg) {
  rank_job *j = arg;
  servd_tensor *h = NULL, *x = NULL, *xs = NULL, *out = NULL;
  float *v = NULL;
  const int P = (C_N + j->world - 1) / j->world, n_r = P < C_N - j->rank * P ? P : C_N - j->rank * P;
  const int64_t full[2] = {C_M, C_N}, part[2] = {C_M, n_r};
  int rc = SERVD_ENOMEM;
  if (!(v = malloc((size_t)C_M * C_N * sizeof *v))) goto done;
  for (size_t i = 0; i < (size_t)C_M * C_N; i++) v[i] = reduce_value(j->rank, i);
  if (!(h = dc_host_f32(v, 2, full))) goto done;
  if ((rc = servd_device_upload(j->device, h, SERVD_BF16, &x))) goto done;
  if ((rc = servd_device_allreduce_sum(j->comm, j->rank, x))) goto done;
  servd_tensor_release(h);
  if (!(h = servd_tensor_new(SERVD_BF16, 2, full))) {
    rc = SERVD_ENOMEM;
    goto done;
  }
  if ((rc = servd_device_copy(h, x)) || (rc = dc_host_values(h, j->reduced))) goto done;
  servd_tensor_release(h);
  for (int r = 0; r < C_M; r++)
    for (int c = 0; c < n_r; c++) v[(size_t)r * n_r + c] = gather_value(r, j->rank * P + c);
  if (!(h = dc_host_f32(v, 2, part))) {
    rc = SERVD_ENOMEM;
    goto done;
  }
  if ((rc = servd_device_upload(j->device, h, SERVD_F32, &xs)) ||
      (rc = servd_device_tensor_new(j->device, SERVD_F32, 2, full, &out)) ||
      (rc = servd_device_allgather_cols(j->comm, j->rank, out, xs)))
    goto done;
  servd_tensor_release(h);
  if (!(h = servd_tensor_new(SERVD_F32, 2, full))) {
    rc = SERVD_ENOMEM;
    goto done;
  }
  if ((rc = servd_device_copy(h, out))) goto done;
  memcpy(j->gathered, servd_tensor_data(h), (size_t)C_M * C_N * sizeof(float));
done:
  j->rc = rc;
  if (rc) snprintf(j->err, sizeof j->err, "%s", servd_last_error());
  servd_tensor_release(h), servd_tensor_release(x), servd_tensor_release(xs), servd_tensor_release(out);
  free(v);
  return NULL;
}

/* allreduce of two ranks: the sum of two exact bf16 values, formed in f32 (exact unless their
 * exponents are far apart) and rounded to bf16: reference and device may differ by one bf16 ulp at a
 * double-rounding tie (2^-7 |ref| allowed); one rank: unchanged, exact. allgather: a copy, exact. */
static void check_world(int world) {
  char name[64];
  snprintf(name, sizeof name, "collectives, %d rank(s)", world);
  servd_device_comm *comm = NULL;
  rank_job jobs[2];
  pthread_t th[2];
  int devices[2] = {dc_device, dc_device == 0 ? 1 : 0};
  float *want = NULL;
  const size_t n = (size_t)C_M * C_N;
  memset(jobs, 0, sizeof jobs);
  TRY(servd_device_comm_create(world, devices, &comm));
  NN(want = malloc(n * sizeof *want));
  for (int r = 0; r < world; r++) {
    jobs[r] = (rank_job){comm, r, world, devices[r], 0, "", malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    NN(jobs[r].reduced && jobs[r].gathered);
  }
  if (world == 1) {
    rank_main(&jobs[0]);
  } else {
    for (int r = 0; r < world; r++)
      if (pthread_create(&th[r], NULL, rank_main, &jobs[r])) {
        dc_verdict(false, name, "pthread_create failed");
        exit(1); /* a started rank waits in NCCL for its peer for good */
      }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
  }
  for (int r = 0; r < world; r++)
    if (jobs[r].rc) {
      dc_verdict(false, name, "rank %d: %s (%s)", r, servd_strerror(jobs[r].rc), jobs[r].err);
      goto done;
    }
  for (size_t i = 0; i < n; i++) {
    float s = 0;
    for (int r = 0; r < world; r++) s += reduce_value(r, i);
    want[i] = world == 1 ? s : dc_round_bf16(s);
  }
  for (int r = 0; r < world; r++) {
    char label[96];
    snprintf(label, sizeof label, "allreduce_sum bf16[5,1001], %d rank(s), rank %d", world, r);
    dc_expect_close(label, jobs[r].reduced, want, n, 0, world == 1 ? 0 : ldexp(1, -7), NULL,
                    world == 1 ? "exact" : "1 bf16 ulp (2^-7|ref|)");
  }
  for (int row = 0; row < C_M; row++)
    for (int c = 0; c < C_N; c++) want[(size_t)row * C_N + c] = gather_value(row, c);
  for (int r = 0; r < world; r++) {
    char label[96];
    snprintf(label, sizeof label, "allgather_cols f32 -> [5,1001], %d rank(s), rank %d", world, r);
    dc_expect_close(label, jobs[r].gathered, want, n, 0, 0, NULL, "exact");
  }
  if (world == 1) { /* abort makes collectives fail; reset makes them work again */
    servd_tensor *x = NULL;
    const int64_t shape[1] = {64};
    TRY(dc_dev_new(SERVD_BF16, 1, shape, &x));
    servd_device_comm_abort(comm);
    const int r_abort = servd_device_allreduce_sum(comm, 0, x);
    const int r_reset = servd_device_comm_reset(comm);
    const int r_after = r_reset ? r_reset : servd_device_allreduce_sum(comm, 0, x);
    const int r_sync = r_after ? r_after : servd_device_sync(dc_device);
    servd_tensor_release(x);
    dc_verdict(r_abort < 0 && r_reset == 0 && r_after == 0 && r_sync == 0, "comm abort, then reset (1 rank)",
               "allreduce after abort %d (< 0 expected), reset %d, allreduce after reset %d, sync %d (0 expected)",
               r_abort, r_reset, r_after, r_sync);
  }
done:
  servd_device_comm_destroy(comm);
  for (int r = 0; r < world; r++) free(jobs[r].reduced), free(jobs[r].gathered);
  free(want);
}

void dc_check_comm(void) {
  check_world(1);
  if (dc_devices >= 2) check_world(2);
  else printf("info collectives: 2 ranks not checked (%d GPU visible)\n", dc_devices);
}
