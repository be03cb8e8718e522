/* An nbdkit plugin (run through nbdkit's cc plugin) serving a file whose FLUSH is slow: a
 * disk whose cache flush costs milliseconds (an HDD), on a machine whose own disk flushes
 * in microseconds. Reads and writes go to the file; a FLUSH, and a FUA write (emulated by
 * nbdkit as a write and a FLUSH), fdatasync the file and then sleep `flush_ms`.
 *
 *   nbdkit -U SOCK cc bench/slowflush.c file=m0.img flush_ms=5
 *
 * Used by scripts/bench-sync.sh --flush-delay (nbdkit's delay filter has no flush delay in
 * the version Debian ships). */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static char *path;
static long flush_ms;
static int fd = -1;

static int sf_config(const char *key, const char *value) {
  if (strcmp(key, "file") == 0) {
    path = nbdkit_realpath(value);
    return path ? 0 : -1;
  }
  if (strcmp(key, "flush_ms") == 0) {
    flush_ms = atol(value);
    return 0;
  }
  nbdkit_error("unknown parameter '%s'", key);
  return -1;
}

static int sf_get_ready(void) {
  if (!path) {
    nbdkit_error("file= is required");
    return -1;
  }
  fd = open(path, O_RDWR);
  if (fd < 0) {
    nbdkit_error("open %s: %m", path);
    return -1;
  }
  return 0;
}

static void *sf_open(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }

static int64_t sf_get_size(void *h) {
  struct stat st;
  if (fstat(fd, &st) < 0) {
    nbdkit_error("fstat: %m");
    return -1;
  }
  return st.st_size;
}

static int sf_can_multi_conn(void *h) { return 1; }
static int sf_can_flush(void *h) { return 1; }
static int sf_can_fua(void *h) { return NBDKIT_FUA_EMULATE; }

static int sf_pread(void *h, void *buf, uint32_t count, uint64_t offset, uint32_t flags) {
  while (count > 0) {
    ssize_t r = pread(fd, buf, count, offset);
    if (r < 0) {
      nbdkit_error("pread: %m");
      return -1;
    }
    if (r == 0) {
      nbdkit_error("pread: end of file");
      errno = EIO;
      return -1;
    }
    buf = (char *)buf + r;
    count -= r;
    offset += r;
  }
  return 0;
}

static int sf_pwrite(void *h, const void *buf, uint32_t count, uint64_t offset,
                     uint32_t flags) {
  while (count > 0) {
    ssize_t r = pwrite(fd, buf, count, offset);
    if (r < 0) {
      nbdkit_error("pwrite: %m");
      return -1;
    }
    buf = (const char *)buf + r;
    count -= r;
    offset += r;
  }
  return 0;
}

static int sf_flush(void *h, uint32_t flags) {
  if (fdatasync(fd) < 0) {
    nbdkit_error("fdatasync: %m");
    return -1;
  }
  struct timespec ts = {flush_ms / 1000, (flush_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  return 0;
}

static struct nbdkit_plugin plugin = {
    .name = "slowflush",
    .config = sf_config,
    .get_ready = sf_get_ready,
    .open = sf_open,
    .get_size = sf_get_size,
    .can_multi_conn = sf_can_multi_conn,
    .can_flush = sf_can_flush,
    .can_fua = sf_can_fua,
    .pread = sf_pread,
    .pwrite = sf_pwrite,
    .flush = sf_flush,
};

NBDKIT_REGISTER_PLUGIN(plugin)
