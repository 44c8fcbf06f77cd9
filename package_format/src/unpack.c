/* Extracting a package into a folder: regular files and folders only, never through a link, all
 * or nothing. Everything is written below a fresh "<dir>.tmp.XXXXXX" through directory descriptors
 * opened with O_NOFOLLOW and files created with O_EXCL, then the temporary folder is renamed to
 * `dir`; a failure removes it. The bytes come from mpk_file, i.e. from the same reader (and the
 * same validated entries) that servd loads, not from a second zip parser. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpk/package.h"
#include "servd/status.h"

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Creates `rel` (an entry path the reader validated: relative, no "." or "..") below root_fd. */
static int extract_one(int root_fd, const char *tmp, const char *rel, const void *data, size_t len) {
  char buf[1100];
  int rc = 0, dfd = dup(root_fd);
  if (dfd < 0 || snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf)
    return servd_fail(SERVD_EIO, "%s/%s: cannot open: %s", tmp, rel, dfd < 0 ? strerror(errno) : "name too long");
  char *comp = buf, *slash;
  while ((slash = strchr(comp, '/'))) {
    *slash = 0;
    if (mkdirat(dfd, comp, 0755) != 0 && errno != EEXIST) goto io;
    int nfd = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd < 0) goto io;
    close(dfd);
    dfd = nfd;
    comp = slash + 1;
  }
  int fd = openat(dfd, comp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) goto io;
  if (write_all(fd, data, len) != 0) {
    close(fd);
    goto io;
  }
  if (close(fd) != 0) goto io;
  close(dfd);
  return 0;
io:
  rc = servd_fail(SERVD_EIO, "%s/%s: cannot write: %s", tmp, rel, strerror(errno));
  close(dfd);
  return rc;
}

int mpk_unpack(mpk_package *p, const char *dir) {
  struct stat st;
  char tmp[4096];
  int rc = 0, root = -1;
  size_t l = strlen(dir);
  while (l > 1 && dir[l - 1] == '/') l--;
  if (l == 0 || l + 16 > sizeof tmp) return servd_fail(SERVD_EINVAL, "%s: expected a folder path", dir);
  if (lstat(dir, &st) == 0) { /* an empty folder is replaced; anything else is left alone */
    DIR *d = S_ISDIR(st.st_mode) ? opendir(dir) : NULL;
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (d) closedir(d);
    if (!d || n) return servd_fail(SERVD_EINVAL, "%s: exists and is not an empty folder", dir);
  } else if (errno != ENOENT) {
    return servd_fail(SERVD_EIO, "%s: %s", dir, strerror(errno));
  }
  snprintf(tmp, sizeof tmp, "%.*s.tmp.XXXXXX", (int)l, dir);
  if (!mkdtemp(tmp)) return servd_fail(SERVD_EIO, "%s: cannot create: %s", tmp, strerror(errno));
  if ((root = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
    rc = servd_fail(SERVD_EIO, "%s: %s", tmp, strerror(errno));
    goto fail;
  }
  for (int i = 0; i < mpk_file_count(p); i++) {
    const char *rel = mpk_file_path(p, i);
    const void *data;
    size_t len;
    if ((rc = mpk_file(p, rel, &data, &len)) || (rc = extract_one(root, tmp, rel, data, len))) goto fail;
  }
  if (fchmod(root, 0755) != 0 || rename(tmp, dir) != 0) {
    rc = servd_fail(SERVD_EIO, "%s: cannot move into place as %s: %s", tmp, dir, strerror(errno));
    goto fail;
  }
  close(root);
  return 0;
fail:
  if (root >= 0) close(root);
  nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
