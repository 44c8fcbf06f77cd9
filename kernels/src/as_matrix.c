/* A tensor seen as a matrix of contiguous rows (servd__as_matrix, cpu-impl.h). */
#include "cpu-impl.h"

bool servd__as_matrix(const servd_tensor *t, servd__mat *m) {
  if (!t || t->ndim < 1 || !t->storage) return false;
  int nd = t->ndim;
  m->base = servd_tensor_data(t);
  m->cols = t->shape[nd - 1];
  m->rows = 1;
  m->row_stride = (int64_t)servd_dtype_row_bytes(t->dtype, m->cols);
  for (int i = 0; i < nd - 1; i++) {
    if (t->shape[i] == 0) {
      m->rows = 0;
      return true;
    }
  }
  /* Merge outer dims from the inside out: dim i must step over exactly shape[i+1] rows of dim i+1. */
  bool have = false;
  int64_t stride = 0;
  for (int i = nd - 2; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (!have) {
      stride = t->strides[i];
      have = true;
    } else if (t->strides[i] != stride * m->rows) {
      return false;
    }
    m->rows *= t->shape[i];
  }
  if (have) m->row_stride = stride;
  return true;
}
