/* Byte-level BPE of one pre-token: the merge order of Hugging Face's Word::merge_all (a min-heap on
 * (rank, position), stale entries skipped by the same test), so ties and odd merge tables give the
 * same ids. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

static int ensure(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *n = realloc(*p, c * elem);
  if (!n) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for a word of %zu symbols", need);
  *p = n;
  *cap = c;
  return 0;
}

static inline bool before(const bpe_merge *a, const bpe_merge *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static inline void heap_push(bpe_merge *h, size_t *n, bpe_merge m) {
  size_t i = (*n)++;
  while (i) {
    size_t p = (i - 1) / 2;
    if (!before(&m, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = m;
}

static inline bpe_merge heap_pop(bpe_merge *h, size_t *n) {
  bpe_merge top = h[0], last = h[--(*n)];
  size_t i = 0, cnt = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= cnt) break;
    if (c + 1 < cnt && before(&h[c + 1], &h[c])) c++;
    if (!before(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (cnt) h[i] = last;
  return top;
}

static int append_ids(int32_t **out, size_t *n_out, size_t *cap, size_t extra) {
  return ensure((void **)out, cap, *n_out + extra, sizeof(int32_t));
}

/* Character-level start (Hugging Face's BPE::merge_word): each character that is a vocabulary
 * entry is a symbol; another one becomes its <0xXX> byte tokens when all exist (byte_fallback),
 * else the unknown token (consecutive ones fused with fuse_unk), else nothing. As there, a pending
 * unknown token is emitted only before the next vocabulary character or at the end. At most n
 * symbols. */
static int32_t char_symbols(const servd_tokenizer *t, const uint8_t *s, size_t n, bpe_sym *sym) {
  int32_t ns = 0;
  bool unk = false;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t l = (size_t)utf8__decode(s + i, n - i, &cp);
    if (!l) l = 1; /* not reached: the text was made valid UTF-8 */
    int32_t id = str_map_get(&t->content_ids, s + i, l);
    if (id >= 0 && t->in_vocab[id]) {
      if (unk) sym[ns] = (bpe_sym){t->unk_id, ns - 1, ns + 1, 1}, ns++, unk = false;
      sym[ns] = (bpe_sym){id, ns - 1, ns + 1, (uint32_t)l};
      ns++;
    } else {
      bool bytes = t->byte_fallback;
      for (size_t k = 0; bytes && k < l; k++) bytes = t->byte_id[s[i + k]] >= 0;
      if (bytes) {
        for (size_t k = 0; k < l; k++) sym[ns] = (bpe_sym){t->byte_id[s[i + k]], ns - 1, ns + 1, 1}, ns++;
      } else if (t->unk_id >= 0) {
        if (unk && !t->fuse_unk) sym[ns] = (bpe_sym){t->unk_id, ns - 1, ns + 1, 1}, ns++;
        unk = true;
      }
    }
    i += l;
  }
  if (unk) sym[ns] = (bpe_sym){t->unk_id, ns - 1, ns + 1, 1}, ns++;
  return ns;
}

int bpe__encode_word(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_work *w, int32_t **out, size_t *n_out,
                     size_t *cap_out) {
  int rc;
  if (!n) return 0;
  if (t->ignore_merges) {
    int32_t id = t->char_level ? str_map_get(&t->content_ids, s, n) : str_map_get(&t->bytes_ids, s, n);
    if (t->char_level && id >= 0 && !t->in_vocab[id]) id = -1;
    if (id >= 0) {
      if ((rc = append_ids(out, n_out, cap_out, 1))) return rc;
      (*out)[(*n_out)++] = id;
      return 0;
    }
  }
  if ((rc = ensure((void **)&w->sym, &w->sym_cap, n, sizeof(bpe_sym)))) return rc;
  bpe_sym *sym = w->sym;
  int32_t ns = 0;
  if (t->char_level) {
    ns = char_symbols(t, s, n, sym);
  } else {
    for (size_t i = 0; i < n; i++) {
      int32_t id = t->byte_id[s[i]];
      if (id < 0) continue; /* no unknown token in byte-level BPE: the byte is dropped, as HF does */
      sym[ns] = (bpe_sym){id, ns - 1, ns + 1, 1};
      ns++;
    }
  }
  if (!ns) return 0;
  sym[ns - 1].next = -1;
  if (ns > 1) {
    if ((rc = ensure((void **)&w->heap, &w->heap_cap, (size_t)ns * 2 + 2, sizeof(bpe_merge)))) return rc;
    bpe_merge *h = w->heap;
    size_t nh = 0;
    int32_t rank, nid;
    for (int32_t i = 0; i + 1 < ns; i++)
      if (merge_map_get(&t->merges, sym[i].id, sym[i + 1].id, &rank, &nid))
        heap_push(h, &nh, (bpe_merge){rank, i, nid});
    while (nh) {
      bpe_merge top = heap_pop(h, &nh);
      bpe_sym *cur = &sym[top.pos];
      if (!cur->len || cur->next < 0) continue;
      bpe_sym *right = &sym[cur->next];
      if (!merge_map_get(&t->merges, cur->id, right->id, &rank, &nid) || nid != top.new_id) continue;
      cur->id = top.new_id;
      cur->len += right->len;
      cur->next = right->next;
      right->len = 0;
      if (cur->next >= 0) sym[cur->next].prev = top.pos;
      /* Each merge adds at most two entries; the heap started with ns - 1 and merges are < ns. */
      if ((rc = ensure((void **)&w->heap, &w->heap_cap, nh + 2, sizeof(bpe_merge)))) return rc;
      h = w->heap;
      if (cur->prev >= 0 && merge_map_get(&t->merges, sym[cur->prev].id, cur->id, &rank, &nid))
        heap_push(h, &nh, (bpe_merge){rank, cur->prev, nid});
      if (cur->next >= 0 && merge_map_get(&t->merges, cur->id, sym[cur->next].id, &rank, &nid))
        heap_push(h, &nh, (bpe_merge){rank, top.pos, nid});
    }
  }
  if ((rc = append_ids(out, n_out, cap_out, (size_t)ns))) return rc;
  for (int32_t i = 0; i >= 0; i = sym[i].next) (*out)[(*n_out)++] = sym[i].id;
  return 0;
}

/* ---- word cache ---------------------------------------------------------------------------------
 * Bounded: when it holds CACHE_MAX_WORDS words (or CACHE_MAX_IDS ids) it is emptied and refilled,
 * which keeps memory fixed without the bookkeeping of an LRU. */
enum { CACHE_MAX_WORDS = 1 << 16, CACHE_MAX_IDS = 1 << 20 };

void word_cache_init(word_cache *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, NULL);
}

void word_cache_free(word_cache *c) {
  str_map_free(&c->map);
  free(c->ent_off);
  free(c->ent_n);
  free(c->ids);
  pthread_mutex_destroy(&c->lock);
}

const int32_t *word_cache_get(word_cache *c, const uint8_t *s, size_t n, int *n_ids) {
  if (!c->map.cap) return NULL;
  int32_t e = str_map_get(&c->map, s, n);
  if (e < 0) return NULL;
  *n_ids = c->ent_n[e];
  return c->ids + c->ent_off[e];
}

void word_cache_put(word_cache *c, const uint8_t *s, size_t n, const int32_t *ids, int n_ids) {
  if (!c->map.cap) {
    if (str_map_init(&c->map, CACHE_MAX_WORDS)) return;
    c->ent_off = malloc(CACHE_MAX_WORDS * sizeof *c->ent_off);
    c->ent_n = malloc(CACHE_MAX_WORDS * sizeof *c->ent_n);
    c->ids = malloc(CACHE_MAX_IDS * sizeof *c->ids);
    if (!c->ent_off || !c->ent_n || !c->ids) {
      str_map_free(&c->map);
      free(c->ent_off), free(c->ent_n), free(c->ids);
      c->ent_off = c->ent_n = c->ids = NULL;
      return;
    }
  }
  if (c->n_ent >= CACHE_MAX_WORDS || c->n_ids + (size_t)n_ids > CACHE_MAX_IDS) {
    /* empty it: reset the map in place */
    memset(c->map.hash, 0, c->map.cap * sizeof *c->map.hash);
    c->map.count = 0;
    c->map.pool.len = 0;
    c->n_ent = c->n_ids = 0;
    if ((size_t)n_ids > CACHE_MAX_IDS) return;
  }
  /* the map was sized for CACHE_MAX_WORDS so it never grows (and never reallocates under readers) */
  if (str_map_put(&c->map, s, n, (int32_t)c->n_ent)) return;
  c->ent_off[c->n_ent] = (int32_t)c->n_ids;
  c->ent_n[c->n_ent] = n_ids;
  memcpy(c->ids + c->n_ids, ids, (size_t)n_ids * sizeof *ids);
  c->n_ids += (size_t)n_ids;
  c->n_ent++;
}
