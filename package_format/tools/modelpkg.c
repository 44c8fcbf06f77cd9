/* modelpkg: builds, inspects and checks servd model packages (docs/package-format.md).
 *
 *   modelpkg pack SRC -o OUT.mpk [--name N] [--model-version V] [--code DIR] [--entry-point M:C]
 *                 [--dtype f32|bf16|f16|q8_0|q4_0] [--convert-all] [--quiet]
 *   modelpkg pack --kind generic --code DIR --entry-point M:C -o OUT.mpk [--weights F.safetensors]...
 *                 [--config CONFIG.json] [--name N] [--model-version V] [--quiet]
 *   modelpkg inspect PKG [--json]      modelpkg verify [--key PUB.pem|DIR] PKG      modelpkg list PKG|DIR
 *   modelpkg sign --key PRIVATE.pem PKG [-o OUT.mpk]
 *   modelpkg unpack PKG DIR            modelpkg synth CONFIG [--seed N] [--dtype f32|f16|bf16]
 *                                                  [--hf-out DIR] [-o OUT.mpk] [--quiet]
 * Exit status: 0 success, 1 failure (one line on stderr naming file, field and expectation), 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mpk/import.h"
#include "mpk/integrity.h"
#include "mpk/lora.h"
#include "mpk/package.h"
#include "servd/status.h"

static int usage(void) {
  fprintf(stderr,
          "usage: modelpkg pack SRC -o OUT.mpk [--name N] [--model-version V] [--code DIR] [--entry-point "
          "MODULE:CALLABLE]\n"
          "                     [--dtype f32|bf16|f16|q8_0|q4_0] [--convert-all] [--quiet]\n"
          "         SRC: a Hugging Face model folder or a GGUF file (llama)\n"
          "       modelpkg pack --kind generic --code DIR --entry-point MODULE:CALLABLE -o OUT.mpk\n"
          "                     [--weights FILE.safetensors]... [--config CONFIG.json] [--name N] [--model-version V] "
          "[--quiet]\n"
          "         a model with predict(inputs) -> outputs; MODULE starts with DIR's name (DIR goes under code/);\n"
          "         tensors F32/F16/BF16, names unique across files; CONFIG: a JSON object (default {})\n"
          "       modelpkg pack --lora ADAPTER_DIR --base BASE.mpk -o OUT.mpk [--name N] [--quiet]\n"
          "         a PEFT LoRA adapter folder, checked against BASE, as an adapter package naming BASE by name and\n"
          "         weight hash (servd --lora NAME=OUT.mpk refuses it on another base)\n"
          "       modelpkg inspect PKG [--json]\n"
          "       modelpkg verify [--key PUBLIC.pem|DIR] PKG\n"
          "         --key: also require a signature by that key (or one of DIR's *.pem keys)\n"
          "       modelpkg sign --key PRIVATE.pem PKG [-o OUT.mpk]\n"
          "         adds an Ed25519 signature of the manifest (in place unless -o)\n"
          "       modelpkg list PKG|DIR\n"
          "       modelpkg unpack PKG DIR\n"
          "       modelpkg synth CONFIG [--seed N] [--dtype f32|f16|bf16] [--hf-out DIR] [-o OUT.mpk] [--quiet]\n"
          "         CONFIG: %s\n",
          mpk_synth_configs());
  return 2;
}

static int fail(void) {
  fprintf(stderr, "modelpkg: %s\n", servd_last_error());
  return 1;
}

typedef struct bar {
  double t0, last;
} bar;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress(void *ctx, uint64_t done, uint64_t total) {
  bar *b = ctx;
  double t = now();
  if (t - b->last < 0.1 && done < total) return;
  b->last = t;
  double frac = total ? (double)done / (double)total : 1.0;
  int w = 30, fill = (int)(frac * w);
  char s[64];
  for (int i = 0; i < w; i++) s[i] = i < fill ? '#' : '.';
  s[w] = 0;
  double el = t - b->t0;
  fprintf(stderr, "\r[%s] %3d%% %8.1f / %.1f MB  %6.0f MB/s", s, (int)(frac * 100), (double)done / 1e6,
          (double)total / 1e6, el > 0 ? (double)done / 1e6 / el : 0.0);
  if (done >= total) fputc('\n', stderr);
}

/* Starts the clock in *b (which must outlive the import) and draws a progress bar on stderr when it
 * is a terminal and not --quiet. */
static void progress_start(bar *b, bool quiet, mpk_import_options *o) {
  *b = (bar){now(), 0};
  if (!quiet && isatty(2)) {
    o->progress = progress;
    o->progress_ctx = b;
  }
}

static int parse_dtype(const char *s, servd_dtype *d) {
  if (servd_dtype_from_name(s, d) == 0 && *d != SERVD_I32 && *d != SERVD_Q4_1) return 0;
  fprintf(stderr, "modelpkg: --dtype %s: expected f32, bf16, f16, q8_0 or q4_0\n", s);
  return -1;
}

static bool is_gguf(const char *path) {
  FILE *f = fopen(path, "rb");
  char m[4] = {0};
  if (!f) return false;
  size_t n = fread(m, 1, 4, f);
  fclose(f);
  return n == 4 && !memcmp(m, "GGUF", 4);
}

static int usage_line(const char *msg) {
  fprintf(stderr, "modelpkg: pack: %s (modelpkg --help)\n", msg);
  return 2;
}

/* modelpkg pack --lora: an adapter package (mpk_lora_pack), named --name or after the folder. */
static int pack_lora(const char *dir, const char *base_path, const char *out, const char *name, bool quiet) {
  mpk_package *base = NULL;
  char fallback[65];
  if (!name) {
    const char *slash = strrchr(dir, '/');
    const char *b = slash && slash[1] ? slash + 1 : dir;
    snprintf(fallback, sizeof fallback, "%s", b);
    name = fallback;
  }
  double t0 = now();
  int rc = mpk_open(base_path, &base);
  if (rc == 0) rc = mpk_lora_pack(dir, base, name, out);
  mpk_close(base);
  if (rc) return fail();
  if (!quiet) printf("wrote %s (LoRA adapter %s for %s) in %.2f s\n", out, name, base_path, now() - t0);
  return 0;
}

static int cmd_pack(int argc, char **argv) {
  const char *src = NULL, *out = NULL, *kind = "causal-lm", *config = NULL, *lora = NULL, *base = NULL;
  bool quiet = false, dtype_set = false;
  const char **weights = calloc((size_t)argc + 1, sizeof *weights); /* at most one per argument */
  size_t nw = 0;
  int rc = 2;
  if (!weights) return fail();
  mpk_import_options o;
  mpk_import_options_init(&o);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    bool more = i + 1 < argc;
    if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && more) out = argv[++i];
    else if (!strcmp(a, "--kind") && more) kind = argv[++i];
    else if (!strcmp(a, "--weights") && more) weights[nw++] = argv[++i];
    else if (!strcmp(a, "--config") && more) config = argv[++i];
    else if (!strcmp(a, "--lora") && more) lora = argv[++i];
    else if (!strcmp(a, "--base") && more) base = argv[++i];
    else if (!strcmp(a, "--name") && more) o.name = argv[++i];
    else if (!strcmp(a, "--model-version") && more) o.model_version = argv[++i];
    else if (!strcmp(a, "--code") && more) o.code_dir = argv[++i];
    else if (!strcmp(a, "--entry-point") && more) o.entry_point = argv[++i];
    else if (!strcmp(a, "--dtype") && more) {
      if (parse_dtype(argv[++i], &o.dtype)) goto done;
      dtype_set = true;
    } else if (!strcmp(a, "--convert-all")) o.convert_all = dtype_set = true;
    else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) quiet = true;
    else if (a[0] != '-' && !src) src = a;
    else {
      rc = usage();
      goto done;
    }
  }
  if (lora || base) {
    rc = !lora || !base || !out || src
             ? usage_line("--lora ADAPTER_DIR needs --base BASE.mpk and -o OUT.mpk, and no SRC")
             : pack_lora(lora, base, out, o.name, quiet);
    goto done;
  }
  bool generic = !strcmp(kind, "generic");
  if (!generic && strcmp(kind, "causal-lm")) {
    rc = usage_line("--kind: expected causal-lm or generic");
    goto done;
  }
  if (!out) {
    rc = usage_line("-o OUT.mpk is required");
    goto done;
  }
  if (generic) {
    if (src) {
      rc = usage_line("--kind generic takes no SRC (use --code, --weights, --config)");
      goto done;
    }
    if (!o.code_dir) {
      rc = usage_line("--kind generic needs --code DIR");
      goto done;
    }
    if (!o.entry_point) {
      rc = usage_line("--kind generic needs --entry-point MODULE:CALLABLE");
      goto done;
    }
    if (dtype_set) {
      rc = usage_line("--dtype and --convert-all apply to causal-lm sources only");
      goto done;
    }
  } else {
    if (!src) {
      rc = usage();
      goto done;
    }
    if (nw || config) {
      rc = usage_line("--weights and --config apply to --kind generic only");
      goto done;
    }
  }
  bar b;
  progress_start(&b, quiet, &o);
  struct stat st;
  if (generic) rc = mpk_pack_generic(weights, nw, config, out, &o);
  else if (stat(src, &st) != 0) rc = servd_fail(SERVD_EIO, "%s: %s", src, strerror(errno));
  else
    rc = S_ISDIR(st.st_mode) ? mpk_pack_hf(src, out, &o)
         : is_gguf(src)      ? mpk_pack_gguf(src, out, &o)
                        : servd_fail(SERVD_EFORMAT, "%s: expected a Hugging Face model folder or a GGUF file", src);
  if (rc) {
    rc = fail();
    goto done;
  }
  if (!quiet) {
    stat(out, &st);
    printf("wrote %s (%.1f MB) in %.2f s\n", out, (double)st.st_size / 1e6, now() - b.t0);
  }
done:
  free(weights);
  return rc;
}

static void fmt_shape(const mpk_tensor_info *t, char *s, size_t cap) {
  size_t l = 0;
  l += (size_t)snprintf(s + l, cap - l, "(");
  for (int d = 0; d < t->ndim; d++)
    l += (size_t)snprintf(s + l, cap - l, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  snprintf(s + l, cap - l, ")");
}

static int cmd_inspect(int argc, char **argv) {
  const char *path = NULL;
  bool as_json = false;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) as_json = true;
    else if (!path) path = argv[i];
    else return usage();
  }
  if (!path) return usage();
  mpk_package *p;
  if (mpk_open(path, &p)) return fail();
  if (as_json) {
    json_dumpf(mpk_manifest(p), stdout, JSON_INDENT(2));
    putchar('\n');
    mpk_close(p);
    return 0;
  }
  printf("package        %s (%llu bytes)\n", path, (unsigned long long)mpk_size(p));
  printf("name           %s\nmodel_version  %s\nkind           %s\nentry_point    %s\nrope_layout    %s\n", mpk_name(p),
         mpk_model_version(p), mpk_kind(p), mpk_entry_point(p), mpk_rope_layout(p) ? mpk_rope_layout(p) : "-");
  json_t *tok = json_object_get(mpk_manifest(p), "tokenizer");
  if (tok) {
    char *s = json_dumps(tok, JSON_COMPACT);
    printf("tokenizer      %s\n", s);
    free(s);
  }
  char *cfg = json_dumps(mpk_config(p), JSON_COMPACT | JSON_SORT_KEYS);
  printf("config         %s\n", cfg);
  free(cfg);
  uint64_t code = 0, other = 0;
  int ncode = 0;
  for (int i = 0; i < mpk_file_count(p); i++) {
    mpk_file_info f;
    mpk_file_info_at(p, i, &f);
    if (!strncmp(f.path, "code/", 5)) {
      code += f.size;
      ncode++;
    } else if (strncmp(f.path, "weights/", 8)) other += f.size;
  }
  printf("files          %d entries: %d code files (%llu bytes), other non-weight files %llu bytes\n",
         mpk_file_count(p), ncode, (unsigned long long)code, (unsigned long long)other);
  printf("\n%-48s %-6s %-16s %12s\n", "tensor", "dtype", "shape", "bytes");
  uint64_t tot = 0, params = 0, by_dtype[SERVD_DTYPE_COUNT] = {0};
  int cnt[SERVD_DTYPE_COUNT] = {0};
  for (int i = 0; i < mpk_tensor_count(p); i++) {
    mpk_tensor_info t;
    mpk_tensor_info_at(p, i, &t);
    char sh[96];
    fmt_shape(&t, sh, sizeof sh);
    printf("%-48s %-6s %-16s %12llu\n", t.name, servd_dtype_name(t.dtype), sh, (unsigned long long)t.nbytes);
    uint64_t n = 1;
    for (int d = 0; d < t.ndim; d++) n *= (uint64_t)t.shape[d];
    params += n;
    tot += t.nbytes;
    by_dtype[t.dtype] += t.nbytes;
    cnt[t.dtype]++;
  }
  printf("\ntotal          %d tensors, %llu parameters, %llu bytes (%.1f MB)\n", mpk_tensor_count(p),
         (unsigned long long)params, (unsigned long long)tot, (double)tot / 1e6);
  for (int d = 0; d < SERVD_DTYPE_COUNT; d++)
    if (cnt[d])
      printf("  %-6s       %d tensors, %llu bytes\n", servd_dtype_name((servd_dtype)d), cnt[d],
             (unsigned long long)by_dtype[d]);
  mpk_close(p);
  return 0;
}

static int cmd_verify(int argc, char **argv) {
  const char *key = NULL, *pkg = NULL, *signer = NULL;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
    else if (argv[i][0] != '-' && !pkg) pkg = argv[i];
    else return usage();
  }
  if (!pkg) return usage();
  mpk_package *p;
  mpk_keyring *keys = NULL;
  double t0 = now();
  if (key && mpk_keyring_load(key, &keys)) return fail();
  int rc = 0;
  /* Hashes first: a signature vouches for the manifest, the hashes tie the entries to it. */
  if (mpk_open(pkg, &p)) {
    p = NULL;
    rc = fail();
  } else if (mpk_verify(p) || (keys && mpk_signature_check(p, keys, &signer))) {
    rc = fail();
  } else {
    printf("%s: OK (%d entries, %d tensors, %llu bytes: schema, alignment, CRC-32 and SHA-256 hold%s%s) in %.2f s\n",
           pkg, mpk_file_count(p), mpk_tensor_count(p), (unsigned long long)mpk_size(p),
           signer ? "; Ed25519 signature by " : "", signer ? signer : "", now() - t0);
  }
  mpk_close(p);
  mpk_keyring_free(keys);
  return rc;
}

static int cmd_sign(int argc, char **argv) {
  const char *key = NULL, *pkg = NULL, *out = NULL;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
    else if ((!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) && i + 1 < argc) out = argv[++i];
    else if (argv[i][0] != '-' && !pkg) pkg = argv[i];
    else return usage();
  }
  if (!key || !pkg) return usage();
  if (mpk_sign(pkg, key, out ? out : pkg)) return fail();
  printf("%s: signed (%s, Ed25519 over manifest.json)\n", out ? out : pkg, MPK_SIGNATURE_ENTRY);
  return 0;
}

static int list_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "modelpkg: %s: %s\n", dir, strerror(errno));
    return 1;
  }
  struct dirent *de;
  int bad = 0;
  printf("%-40s %-12s %-10s %8s %12s\n", "file", "name", "version", "tensors", "bytes");
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l < 5 || strcmp(de->d_name + l - 4, ".mpk")) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    mpk_package *p;
    if (mpk_open(path, &p)) {
      fprintf(stderr, "modelpkg: %s\n", servd_last_error());
      bad = 1;
      continue;
    }
    printf("%-40s %-12s %-10s %8d %12llu\n", de->d_name, mpk_name(p), mpk_model_version(p), mpk_tensor_count(p),
           (unsigned long long)mpk_size(p));
    mpk_close(p);
  }
  closedir(d);
  return bad;
}

static int cmd_list(int argc, char **argv) {
  if (argc != 1) return usage();
  struct stat st;
  if (stat(argv[0], &st) == 0 && S_ISDIR(st.st_mode)) return list_dir(argv[0]);
  mpk_package *p;
  if (mpk_open(argv[0], &p)) return fail();
  printf("%12s %12s %-8s %s\n", "offset", "size", "method", "path");
  for (int i = 0; i < mpk_file_count(p); i++) {
    mpk_file_info f;
    mpk_file_info_at(p, i, &f);
    printf("%12llu %12llu %-8s %s\n", (unsigned long long)f.offset, (unsigned long long)f.size,
           f.method ? "deflate" : "stored", f.path);
  }
  mpk_close(p);
  return 0;
}

/* Validates (mpk_open, then every hash with mpk_verify) and extracts regular files only, all or
 * nothing (mpk_unpack). */
static int cmd_unpack(int argc, char **argv) {
  if (argc != 2) return usage();
  mpk_package *p;
  if (mpk_open(argv[0], &p)) return fail();
  if (mpk_verify(p) || mpk_unpack(p, argv[1])) {
    mpk_close(p);
    return fail();
  }
  printf("unpacked %d entries into %s\n", mpk_file_count(p), argv[1]);
  mpk_close(p);
  return 0;
}

static int cmd_synth(int argc, char **argv) {
  const char *cfg = NULL, *hf = NULL, *out = NULL;
  uint64_t seed = 0;
  servd_dtype dt = SERVD_BF16;
  bool quiet = false, dt_set = false;
  mpk_import_options o;
  mpk_import_options_init(&o);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    bool more = i + 1 < argc;
    if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && more) out = argv[++i];
    else if (!strcmp(a, "--hf-out") && more) hf = argv[++i];
    else if (!strcmp(a, "--seed") && more) seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(a, "--dtype") && more) {
      if (servd_dtype_from_name(argv[++i], &dt) || (dt != SERVD_F32 && dt != SERVD_F16 && dt != SERVD_BF16)) {
        fprintf(stderr, "modelpkg: --dtype %s: expected f32, f16 or bf16\n", argv[i]);
        return 2;
      }
      dt_set = true;
    } else if (!strcmp(a, "--code") && more) o.code_dir = argv[++i];
    else if (!strcmp(a, "--name") && more) o.name = argv[++i];
    else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) quiet = true;
    else if (a[0] != '-' && !cfg) cfg = a;
    else return usage();
  }
  if (!cfg || (!hf && !out)) return usage();
  if (!dt_set && !strcmp(cfg, "tiny")) dt = SERVD_F32; /* tiny tests compare against f32 references */
  bar b;
  progress_start(&b, quiet, &o);
  if (mpk_synth(cfg, seed, dt, hf, out, &o)) return fail();
  if (!quiet)
    printf("synthesized %s (%s, seed %llu)%s%s%s%s in %.2f s\n", cfg, servd_dtype_name(dt), (unsigned long long)seed,
           hf ? " folder " : "", hf ? hf : "", out ? " package " : "", out ? out : "", now() - b.t0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *cmd = argv[1];
  if (!strcmp(cmd, "pack")) return cmd_pack(argc - 2, argv + 2);
  if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
  if (!strcmp(cmd, "verify")) return cmd_verify(argc - 2, argv + 2);
  if (!strcmp(cmd, "sign")) return cmd_sign(argc - 2, argv + 2);
  if (!strcmp(cmd, "list")) return cmd_list(argc - 2, argv + 2);
  if (!strcmp(cmd, "unpack")) return cmd_unpack(argc - 2, argv + 2);
  if (!strcmp(cmd, "synth")) return cmd_synth(argc - 2, argv + 2);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage();
    return 0;
  }
  return usage();
}
