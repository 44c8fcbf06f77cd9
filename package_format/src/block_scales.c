/* Block-quantized tensors from outside (GGUF) carry f16 scales; a NaN or infinite one would turn
 * every output that touches its block into NaN far from the cause, so pack refuses it naming the
 * tensor, the block and the field. */
#include <stdio.h>

#include "import-impl.h"
#include "mpk-impl.h"
#include "servd/dtype_traits.h"

int mpk__check_block_scales(const char *what, const char *tensor, servd_dtype dt, const void *data, uint64_t nbytes) {
  const servd_dtype_traits *f = servd_dtype_get_traits(dt); /* where the scales are: servd/dtypes.def */
  if (!f || f->n_scales == 0) return 0;
  const size_t bb = f->block_bytes;
  const uint8_t *p = data;
  for (uint64_t b = 0; b < nbytes / bb; b++, p += bb) {
    for (int i = 0; i < f->n_scales; i++) {
      const uint16_t h = rd16(p + f->scales[i].offset);
      if ((h & 0x7c00) == 0x7c00)
        return servd_fail(
            SERVD_EFORMAT, "%s: tensor \"%s\": %s block %llu: scale %s is %s (f16 0x%04x), expected a finite number",
            what, tensor, f->name, (unsigned long long)b, f->scales[i].name, h & 0x3ff ? "NaN" : "infinite", h);
    }
  }
  return 0;
}
