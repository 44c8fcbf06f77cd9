/* servd_embedding: row gather with dequantization; the vocabulary may be sharded by row_offset. */
#include <string.h>

#include "cpu-impl.h"

int servd_embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids, int64_t row_offset) {
  char a[96], b[96], c[96];
  servd__mat mo, mt;
  if (!out || !table || !ids) return servd_fail(SERVD_EINVAL, "embedding: NULL tensor");
#define BAD(why) \
  servd_fail(SERVD_EINVAL, "embedding: %s (out %s, table %s, ids %s)", why, servd_tensor_describe(out, a, sizeof a), \
             servd_tensor_describe(table, b, sizeof b), servd_tensor_describe(ids, c, sizeof c))
  if (out->dtype != SERVD_F32 || ids->dtype != SERVD_I32) return BAD("out must be f32 and ids i32");
  if (table->dtype == SERVD_I32 || (unsigned)table->dtype >= SERVD_DTYPE_COUNT)
    return BAD("table must be f32, f16, bf16 or a block dtype");
  if (table->ndim != 2) return BAD("table must be 2-D (vocab,d)");
  if (out->device >= 0 || table->device >= 0 || ids->device >= 0) return BAD("tensors must be on the host");
  if (!servd_tensor_is_contiguous(ids)) return BAD("ids must be contiguous");
  if (!servd__as_matrix(out, &mo) || !servd__as_matrix(table, &mt)) return BAD("views cannot be merged into rows");
  const int64_t m = servd_tensor_numel(ids);
  if (mo.rows != m || mo.cols != mt.cols) return BAD("out must be (numel(ids), d)");
  if ((uintptr_t)mo.base % 4 || mo.row_stride % 4 || (uintptr_t)mt.base % 2 || mt.row_stride % 2 ||
      (table->dtype == SERVD_F32 && ((uintptr_t)mt.base % 4 || mt.row_stride % 4)))
    return BAD("misaligned view");
  const int32_t *id = servd_tensor_data(ids);
  for (int64_t i = 0; i < m; i++) {
    if (id[i] < 0)
      return servd_fail(SERVD_ERANGE, "embedding: ids[%lld] = %d is negative (table %s)", (long long)i, id[i],
                        servd_tensor_describe(table, b, sizeof b));
  }
#undef BAD
  for (int64_t i = 0; i < m; i++) {
    float *o = (float *)(mo.base + i * mo.row_stride);
    int64_t r = (int64_t)id[i] - row_offset;
    if (r < 0 || r >= mt.rows) {
      memset(o, 0, (size_t)mo.cols * sizeof(float)); /* another shard owns this id */
      continue;
    }
    int rc = servd_row_to_f32(table->dtype, mt.base + r * mt.row_stride, o, mt.cols);
    if (rc) return rc;
  }
  return 0;
}
