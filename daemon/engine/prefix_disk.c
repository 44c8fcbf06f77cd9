/* The prefix cache's disk tier: see prefix_disk.h. */
#include "engine/prefix_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/prefix_cache.h"
#include "engine/prefix_disk_format.h"
#include "servd/status.h"

#define QUEUE_BLOCKS 256 /* copies waiting for the writer at most; more are dropped */

/* The index: chain hash -> file size and last use, open addressing (linear probing, tombstones). */
typedef struct entry {
  uint64_t hash; /* 0: empty slot (a chain hash of 0 is never stored) */
  uint64_t size;
  int64_t used; /* last use, ns (CLOCK_REALTIME, as file times) */
  bool live;
} entry;

typedef struct job {
  struct job *next;
  uint64_t hash, parent;
  int32_t *tokens; /* block_size */
  uint8_t *payload;
} job;

struct prefix_disk {
  char *dir; /* DIR/<key> */
  uint64_t key, max_bytes;
  servd_kv_cache *const *kv;
  int tp, block_size;
  size_t rank_bytes, payload_bytes;
  prefix_disk_meta meta; /* what every file of this model says, but its hashes */

  pthread_mutex_t mu; /* the index, the queue, the counters */
  pthread_cond_t cv;
  entry *slots;
  size_t cap, n_live, n_used; /* n_used: live and tombstones */
  uint64_t bytes;
  job *head, *tail;
  int queued;
  bool stop;
  pthread_t writer;
  prefix_disk_stats st;

  /* the scheduler's memo of the last chain hashed (blocks registered in order, one sequence at a time) */
  const int32_t *memo_tokens;
  int memo_index;
  uint64_t memo_hash;
  int32_t *ids;               /* scratch: a cache's blocks */
  uint64_t *hashes, *parents; /* scratch: chain hashes of the blocks fetched and of those before them */
  int max_ids;
};

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

uint64_t prefix_disk_key(const char *manifest_json, servd_dtype dtype, int block_size, int n_layers, int n_kv_heads,
                         int head_dim, int tp) {
  int32_t geo[6] = {(int32_t)dtype, block_size, n_layers, n_kv_heads, head_dim, tp};
  uint64_t h = prefix_cache_key("servd-kv-disk-v1", manifest_json);
  return prefix_cache_hash(h, geo, 6, 0x6b7664697363ull);
}

/* ---- the index (under mu) ------------------------------------------------------------------------ */

static entry *find(prefix_disk *d, uint64_t h) {
  if (!d->cap) return NULL;
  for (size_t i = h & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
    if (d->slots[i].hash == 0) return NULL;
    if (d->slots[i].hash == h && d->slots[i].live) return &d->slots[i];
  }
}

static int grow_index(prefix_disk *d) {
  size_t cap = d->cap ? d->cap * 2 : 1024;
  while (cap < 4 * (d->n_live + 1)) cap *= 2;
  entry *old = d->slots, *s = calloc(cap, sizeof *s);
  if (!s) return SERVD_ENOMEM;
  size_t old_cap = d->cap;
  d->slots = s;
  d->cap = cap;
  d->n_used = d->n_live;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].hash && old[i].live) {
      size_t j = old[i].hash & (cap - 1);
      while (s[j].hash) j = (j + 1) & (cap - 1);
      s[j] = old[i];
    }
  free(old);
  return 0;
}

static void add(prefix_disk *d, uint64_t h, uint64_t size, int64_t used) {
  entry *e = find(d, h);
  if (e) {
    d->bytes += size - e->size;
    e->size = size;
    e->used = used;
    return;
  }
  if (2 * (d->n_used + 1) > d->cap && grow_index(d) != 0) return; /* no room: the file stays unindexed */
  size_t i = h & (d->cap - 1);
  while (d->slots[i].hash && d->slots[i].live) i = (i + 1) & (d->cap - 1);
  if (!d->slots[i].hash) d->n_used++;
  d->slots[i] = (entry){.hash = h, .size = size, .used = used, .live = true};
  d->n_live++;
  d->bytes += size;
}

static void path_of(const prefix_disk *d, uint64_t h, char *buf, size_t cap, const char *ext) {
  snprintf(buf, cap, "%s/%016" PRIx64 "%s", d->dir, h, ext);
}

/* Drops entry e and its file. */
static void drop(prefix_disk *d, entry *e) {
  char p[4200];
  path_of(d, e->hash, p, sizeof p, ".kvb");
  unlink(p);
  d->bytes -= e->size;
  e->live = false; /* a tombstone: probing goes on past it */
  d->n_live--;
}

/* Least recently used files out until the bound holds. */
static void evict(prefix_disk *d) {
  while (d->bytes > d->max_bytes && d->n_live > 0) {
    entry *lru = NULL;
    for (size_t i = 0; i < d->cap; i++)
      if (d->slots[i].hash && d->slots[i].live && (!lru || d->slots[i].used < lru->used)) lru = &d->slots[i];
    drop(d, lru);
    d->st.evicted++;
  }
}

/* ---- the writer thread ------------------------------------------------------------------------- */

static void free_job(job *j) {
  if (!j) return;
  free(j->tokens);
  free(j->payload);
  free(j);
}

/* Writes one block file through a temporary name; its size, or 0 on failure. */
static uint64_t write_file(prefix_disk *d, const job *j) {
  prefix_disk_meta m = d->meta;
  m.hash = j->hash;
  m.parent_hash = j->parent;
  size_t hb = prefix_disk_header_bytes((uint32_t)d->block_size);
  uint8_t *hdr = malloc(hb);
  if (!hdr) return 0;
  prefix_disk_header_write(hdr, &m, j->tokens, j->payload);
  char tmp[4200], final[4200], ext[64];
  /* a name of this writer's own: two models (or processes) sharing the directory never interleave */
  snprintf(ext, sizeof ext, ".%ld.%p.tmp", (long)getpid(), (void *)d);
  path_of(d, j->hash, tmp, sizeof tmp, ext);
  path_of(d, j->hash, final, sizeof final, ".kvb");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  const uint8_t *parts[2] = {hdr, j->payload};
  size_t lens[2] = {hb, d->payload_bytes};
  for (int k = 0; ok && k < 2; k++)
    for (size_t off = 0; ok && off < lens[k];) {
      ssize_t w = write(fd, parts[k] + off, lens[k] - off);
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      off += w > 0 ? (size_t)w : 0;
    }
  if (fd >= 0 && close(fd) != 0) ok = false;
  free(hdr);
  if (ok && rename(tmp, final) == 0) return hb + d->payload_bytes;
  unlink(tmp);
  return 0;
}

static void *writer_main(void *arg) {
  prefix_disk *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->head && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
    job *j = d->head;
    if (!j) break; /* stopping, and nothing left */
    d->head = j->next;
    if (!d->head) d->tail = NULL;
    d->queued--;
    pthread_mutex_unlock(&d->mu);
    uint64_t size = write_file(d, j);
    pthread_mutex_lock(&d->mu);
    if (size) {
      add(d, j->hash, size, now_ns());
      d->st.blocks_written++;
      d->st.bytes_written += size;
      evict(d);
    }
    free_job(j);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* ---- the tier ------------------------------------------------------------------------------------ */

/* The chain hash of a block after the one hashed `parent` (0: the first block). */
static uint64_t next_hash(const prefix_disk *d, uint64_t parent, const int32_t *block) {
  uint64_t h = prefix_cache_hash(parent, block, d->block_size, d->key);
  return h ? h : 1; /* 0 marks an empty index slot */
}

/* Chain hash of block `index` of the sequence at tokens (its blocks 0..index), memoized for the
 * usual case: the next block of the same sequence. */
static uint64_t chain_hash(prefix_disk *d, const int32_t *tokens, int index, uint64_t *parent) {
  uint64_t h = 0;
  int from = 0;
  if (d->memo_tokens == tokens && d->memo_index == index - 1) {
    h = d->memo_hash;
    from = index;
  }
  uint64_t p = h;
  for (int i = from; i <= index; i++) {
    p = h;
    h = next_hash(d, h, tokens + (size_t)i * (size_t)d->block_size);
  }
  d->memo_tokens = tokens;
  d->memo_index = index;
  d->memo_hash = h;
  *parent = p;
  return h;
}

static void stored(void *ctx, block_manager *bm, const int32_t *tokens, int index, int32_t id) {
  (void)bm;
  prefix_disk *d = ctx;
  uint64_t parent, h = chain_hash(d, tokens, index, &parent);
  pthread_mutex_lock(&d->mu);
  bool have = find(d, h) != NULL, full = d->queued >= QUEUE_BLOCKS;
  if (full && !have) d->st.dropped++;
  pthread_mutex_unlock(&d->mu);
  if (have || full) return;
  job *j = calloc(1, sizeof *j);
  if (j) {
    j->tokens = malloc((size_t)d->block_size * sizeof(int32_t));
    j->payload = malloc(d->payload_bytes);
  }
  bool ok = j && j->tokens && j->payload;
  for (int r = 0; ok && r < d->tp; r++)
    ok = servd_kv_cache_block_read(d->kv[r], id, j->payload + r * d->rank_bytes) == 0;
  if (!ok) {
    free_job(j);
    servd_fail(0, "%s", ""); /* a failed copy only loses the disk copy */
    return;
  }
  memcpy(j->tokens, tokens + (size_t)index * (size_t)d->block_size, (size_t)d->block_size * sizeof(int32_t));
  j->hash = h;
  j->parent = parent;
  pthread_mutex_lock(&d->mu);
  if (d->tail) d->tail->next = j;
  else d->head = j;
  d->tail = j;
  d->queued++;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* Reads a whole file; NULL (and *len 0) when it cannot. The caller frees. */
static uint8_t *read_all(const char *path, size_t *len) {
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat sb;
  uint8_t *buf = NULL;
  if (fstat(fd, &sb) == 0 && sb.st_size >= 0 && (buf = malloc((size_t)sb.st_size + 1))) {
    size_t n = 0;
    while (n < (size_t)sb.st_size) {
      ssize_t r = read(fd, buf + n, (size_t)sb.st_size - n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      n += (size_t)r;
    }
    *len = n;
    futimens(fd, NULL); /* last use: kept across restarts as the modification time */
  }
  close(fd);
  return buf;
}

static void fetch(void *ctx, block_manager *bm, const int32_t *tokens, int max_blocks) {
  prefix_disk *d = ctx;
  pthread_mutex_lock(&d->mu);
  bool any = d->n_live > 0;
  pthread_mutex_unlock(&d->mu);
  if (!any) return;
  if (max_blocks > d->max_ids) max_blocks = d->max_ids;
  prefix_chain chain = {0};
  int evictable = 0, bs = d->block_size;
  int m = prefix_cache_match(&bm->pc, bm->key, tokens, max_blocks, d->ids, &chain, &evictable);
  /* the blocks after the memory hits that are on disk, as many as free blocks can take (taking
   * none from the cache, whose blocks may be the hits themselves) */
  int room = servd_kv_cache_free_blocks(bm->kv), k = 0;
  uint64_t h = 0;
  for (int i = 0; i < max_blocks && k < room; i++) {
    uint64_t parent = h;
    h = next_hash(d, h, tokens + (size_t)i * (size_t)bs);
    if (i < m) continue;
    pthread_mutex_lock(&d->mu);
    bool have = find(d, h) != NULL;
    pthread_mutex_unlock(&d->mu);
    if (!have) break;
    d->hashes[k] = h;
    d->parents[k++] = parent;
  }
  if (k == 0 || prefix_cache_alloc(&bm->pc, k, d->ids) != 0) {
    servd_fail(0, "%s", "");
    return;
  }
  prefix_disk_meta want = d->meta;
  for (int j = 0; j < k; j++) {
    const int32_t *bt = tokens + (size_t)(m + j) * (size_t)bs;
    want.hash = d->hashes[j];
    want.parent_hash = d->parents[j];
    char path[4200];
    path_of(d, want.hash, path, sizeof path, ".kvb");
    size_t len;
    uint8_t *buf = read_all(path, &len);
    const uint8_t *payload = NULL;
    const char *why = "unreadable";
    bool ok = buf && prefix_disk_check(buf, len, &want, bt, &payload, &why) == PREFIX_DISK_OK;
    for (int r = 0; ok && r < d->tp; r++)
      ok = servd_kv_cache_block_write(d->kv[r], d->ids[j], payload + (size_t)r * d->rank_bytes) == 0;
    free(buf);
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, want.hash);
    if (ok) {
      if (e) e->used = now_ns();
      d->st.blocks_read++;
    } else {
      d->st.rejected++;
      if (e) drop(d, e);
    }
    pthread_mutex_unlock(&d->mu);
    if (!ok) {
      fprintf(stderr, "servd: prefix cache: %s: %s; removed, its tokens are computed instead\n", path, why);
      break;
    }
    prefix_cache_register(&bm->pc, bm->key, &chain, d->ids[j], bt);
  }
  /* registered blocks stay cached (evictable until a sequence takes them); the others are free */
  prefix_cache_release(&bm->pc, k, d->ids);
  servd_fail(0, "%s", "");
}

bm_tier prefix_disk_tier(prefix_disk *d) { return (bm_tier){.ctx = d, .stored = stored, .fetch = fetch}; }

/* ---- open, close --------------------------------------------------------------------------------- */

static int mkdirs(const char *path) {
  char p[4096];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Indexes DIR/<key>'s block files (a name that is not 16 hex digits + ".kvb" is not ours: left
 * alone; a leftover "<hash>.*.tmp" of an interrupted write is removed). */
static void scan(prefix_disk *d) {
  DIR *dir = opendir(d->dir);
  if (!dir) return;
  struct dirent *de;
  while ((de = readdir(dir))) {
    const char *n = de->d_name;
    size_t len = strlen(n);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", d->dir, n);
    if (len > 20 && strcmp(n + len - 4, ".tmp") == 0 && strspn(n, "0123456789abcdef") == 16) {
      unlink(path);
      continue;
    }
    if (len != 20 || strcmp(n + 16, ".kvb") != 0 || strspn(n, "0123456789abcdef") != 16) continue;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    uint64_t h = strtoull(n, NULL, 16);
    if (h == 0) continue;
    add(d, h, (uint64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec);
  }
  closedir(dir);
  evict(d);
}

int prefix_disk_open(prefix_disk **out, const char *dir, uint64_t max_bytes, servd_kv_cache *const *kv, int tp,
                     int n_layers, int n_kv_heads_total, int head_dim, uint64_t key) {
  *out = NULL;
  prefix_disk *d = calloc(1, sizeof *d);
  if (!d) return servd_fail(SERVD_ENOMEM, "prefix cache directory: out of memory");
  size_t n = strlen(dir) + 32;
  if (!(d->dir = malloc(n))) {
    free(d);
    return servd_fail(SERVD_ENOMEM, "prefix cache directory: out of memory");
  }
  snprintf(d->dir, n, "%s/%016" PRIx64, dir, key);
  d->key = key;
  d->max_bytes = max_bytes;
  d->kv = kv;
  d->tp = tp;
  d->block_size = servd_kv_cache_block_size(kv[0]);
  servd_dtype dt = servd_kv_cache_dtype(kv[0]);
  /* a file holds every rank's share of the block, rank after rank, in the caches' layout */
  d->rank_bytes = servd_kv_cache_block_bytes(n_layers, n_kv_heads_total / tp, head_dim, d->block_size, dt);
  d->payload_bytes = d->rank_bytes * (size_t)tp;
  d->meta = (prefix_disk_meta){.model_key = key,
                               .dtype = (uint32_t)dt,
                               .block_size = (uint32_t)d->block_size,
                               .n_layers = (uint32_t)n_layers,
                               .n_kv_heads = (uint32_t)n_kv_heads_total,
                               .head_dim = (uint32_t)head_dim,
                               .tp = (uint32_t)tp,
                               .payload_bytes = d->payload_bytes};
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  d->max_ids = servd_kv_cache_n_blocks(kv[0]);
  d->ids = calloc((size_t)d->max_ids, sizeof *d->ids);
  d->hashes = calloc((size_t)d->max_ids, sizeof *d->hashes);
  d->parents = calloc((size_t)d->max_ids, sizeof *d->parents);
  d->memo_index = -2;
  int rc = 0;
  if (!d->ids || !d->hashes || !d->parents || d->rank_bytes == 0) {
    rc = servd_fail(SERVD_ENOMEM, "prefix cache directory: out of memory");
  } else if (mkdirs(d->dir) != 0) {
    rc = servd_fail(SERVD_EIO, "--prefix-cache-dir: cannot create %s: %s", d->dir, strerror(errno));
  } else if (access(d->dir, W_OK | R_OK | X_OK) != 0) {
    rc = servd_fail(SERVD_EIO, "--prefix-cache-dir: %s is not readable and writable: %s", d->dir, strerror(errno));
  }
  if (rc) {
    prefix_disk_close(d);
    return rc;
  }
  *out = d;
  scan(d);
  if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
    *out = NULL;
    d->stop = true;
    d->writer = 0;
    prefix_disk_close(d);
    return servd_fail(SERVD_ENOMEM, "prefix cache directory: cannot start the writer thread");
  }
  return 0;
}

void prefix_disk_close(prefix_disk *d) {
  if (!d) return;
  if (d->writer) {
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->writer, NULL);
  }
  while (d->head) {
    job *j = d->head;
    d->head = j->next;
    free_job(j);
  }
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d->slots);
  free(d->ids);
  free(d->hashes);
  free(d->parents);
  free(d->dir);
  free(d);
}

void prefix_disk_get_stats(prefix_disk *d, prefix_disk_stats *s) {
  memset(s, 0, sizeof *s);
  if (!d) return;
  pthread_mutex_lock(&d->mu);
  *s = d->st;
  s->files = d->n_live;
  s->bytes = d->bytes;
  pthread_mutex_unlock(&d->mu);
}
