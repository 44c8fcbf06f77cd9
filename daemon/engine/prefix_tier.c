/* The disk tier of a model's prefix cache: see prefix_tier.h. */
#include "engine/prefix_tier.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/engine_impl.h"
#include "engine/prefix_disk.h"
#include "mpk/package.h"

int servd__prefix_tier_open(servd_model *m) {
  if (!m->o.prefix_cache_dir || !m->o.prefix_cache_dir[0]) return 0;
  if (!m->o.prefix_cache) {
    fprintf(stderr, "servd: model '%s': --prefix-cache-dir is not used: the prefix cache is off\n", m->name);
    return 0;
  }
  if (m->gpus > 0) {
    fprintf(stderr, "servd: model '%s': --prefix-cache-dir is not used: the KV cache is on GPUs\n", m->name);
    return 0;
  }
  /* the package's content: its canonical manifest lists every entry's SHA-256 */
  char *man = json_dumps(mpk_manifest(m->pkg), JSON_COMPACT | JSON_SORT_KEYS);
  if (!man) return servd_fail(SERVD_ENOMEM, "prefix cache directory: out of memory");
  int kv_heads = m->kv_heads * m->tp;
  uint64_t key = prefix_disk_key(man, m->o.kv_dtype, m->block_size, m->n_layers, kv_heads, m->head_dim, m->tp);
  free(man);
  uint64_t mb = m->o.prefix_cache_dir_mb > 0 ? (uint64_t)m->o.prefix_cache_dir_mb : 4096;
  prefix_disk *d = NULL;
  int rc = prefix_disk_open(&d, m->o.prefix_cache_dir, mb << 20, m->kv, m->tp, m->n_layers, kv_heads, m->head_dim, key);
  if (rc) return rc;
  m->prefix_disk = d;
  m->sched.bm.tier = prefix_disk_tier(d);
  prefix_disk_stats st;
  prefix_disk_get_stats(d, &st);
  fprintf(stderr, "servd: model '%s': prefix cache on disk in %s: %llu blocks (%.1f MB) found, bound %llu MB\n",
          m->name, m->o.prefix_cache_dir, (unsigned long long)st.files, (double)st.bytes / 1e6, (unsigned long long)mb);
  return 0;
}

void servd__prefix_tier_close(servd_model *m) {
  prefix_disk_close(m->prefix_disk);
  m->prefix_disk = NULL;
  m->sched.bm.tier = (bm_tier){0};
}

void servd__prefix_tier_stats(const servd_model *m, servd_model_stats *s) {
  if (!m->prefix_disk) return;
  prefix_disk_stats st;
  prefix_disk_get_stats(m->prefix_disk, &st);
  s->prefix_disk = true;
  s->prefix_disk_written = st.blocks_written;
  s->prefix_disk_bytes_written = st.bytes_written;
  s->prefix_disk_read = st.blocks_read;
  s->prefix_disk_rejected = st.rejected;
  s->prefix_disk_evicted = st.evicted;
  s->prefix_disk_dropped = st.dropped;
  s->prefix_disk_files = st.files;
  s->prefix_disk_bytes = st.bytes;
}
