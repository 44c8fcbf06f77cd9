/* The host function table handed to every interpreter's servd module. */
#include "interp-impl.h"

#include <stdlib.h>

#include "mpk/package.h"
#include "op_dispatch.h"
#include "plan-impl.h"

/* The table is mechanism-neutral (void *pkg); these adapt the package library's typed calls. */
static int pkg_tensor(void *p, const char *name, servd_tensor **out) { return mpk_tensor(p, name, out); }
static int pkg_file(void *p, const char *path, const void **data, size_t *len) { return mpk_file(p, path, data, len); }
static int pkg_tensor_count(void *p) { return mpk_tensor_count(p); }
static const char *pkg_tensor_name(void *p, int i) { return mpk_tensor_name(p, i); }
static int pkg_file_count(void *p) { return mpk_file_count(p); }
static const char *pkg_file_path(void *p, int i) { return mpk_file_path(p, i); }

static char *manifest_json(void *pkg) {
  json_t *m = mpk_manifest(pkg);
  return m ? json_dumps(m, JSON_COMPACT) : NULL; /* malloc'd by the main libc: host->free */
}

static const servd_host_api g_api = {
    .abi = SERVD_GUEST_ABI,
    .size = sizeof(servd_host_api),
    .alloc = malloc,
    .free = free,
    .last_error = servd_last_error,
    .fail = servd_fail,
    .dtype_name = servd_dtype_name,
    .dtype_from_name = servd_dtype_from_name,
    .dtype_block_elems = servd_dtype_block_elems,
    .dtype_block_bytes = servd_dtype_block_bytes,
    .storage_alloc = servd_storage_alloc,
    .storage_release = servd_storage_release,
    .storage_data = servd_storage_data,
    .storage_get_kind = servd_storage_get_kind,
    .tensor_new = servd_tensor_new,
    .tensor_from_storage = servd_tensor_from_storage,
    .tensor_narrow = servd_tensor_narrow,
    .tensor_reshape = servd_tensor_reshape,
    .tensor_retain = servd_tensor_retain,
    .tensor_release = servd_tensor_release,
    .tensor_numel = servd_tensor_numel,
    .tensor_is_contiguous = servd_tensor_is_contiguous,
    .tensor_nbytes = servd_tensor_nbytes,
    .row_to_f32 = servd_row_to_f32,
    .row_from_f32 = servd_row_from_f32,
    .pkg_tensor = pkg_tensor,
    .pkg_file = pkg_file,
    .pkg_tensor_count = pkg_tensor_count,
    .pkg_tensor_name = pkg_tensor_name,
    .pkg_file_count = pkg_file_count,
    .pkg_file_path = pkg_file_path,
    .pkg_manifest_json = manifest_json,
    .device_tensor_new = servd_device_tensor_new,
    .device_upload = servd_device_upload,
    .device_weight = servd_device_weight,
    .device_sync = servd_device_sync,
    .device_kv_device = servd_device_kv_device,
    .device_batch_tensor = servd_device_batch_tensor,
/* the ops of op_dispatch.c, recording while a plan is captured (plan_record.c) */
#define SERVD_OP(name, dispatch, py, sig, names) .name = servd_plan__##name,
#include "servd/ops.def"
#undef SERVD_OP
};

const servd_host_api *servd_host_api__get(void) { return &g_api; }
