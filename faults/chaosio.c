/* chaosio: an LD_PRELOAD tracer of libc's file calls beneath the language (issue #31).
 *
 * Built by faults/shim.py (cc -shared) and put in a job's LD_PRELOAD by the launcher.
 * Until it is configured it passes every call straight through. Configuration is one
 * string, "rank=R;attempt=A;trace=DIR;roots=/a:/b;ord=FILE[;point=MODE:N]", given
 *
 *   - by the Python tracer of a rank (chaos.target.job.native), which calls
 *     chaos_shim_configure() and chaos_shim_register(handler): every call on a path under
 *     a root (or an fd opened there) is handed to that handler, which performs it through
 *     the Python interposer, so a native write is traced, numbered and faulted exactly as
 *     a Python one ("delegate" mode). Calls the interposer makes itself come back here
 *     and are passed through (the handler answers PASS, or this thread is inside it);
 *   - by the environment (CHAOS_SHIM, which the Python tracer exports) in any other
 *     process the rank starts, a `dd` or a Python child the interposer does not trace
 *     ("standalone" mode): this file writes the same JSON records as the interposer into
 *     trace-r<R>-a<A>-p<pid>.jsonl (bytes into its .data file) and fires the point itself
 *     (kill before / after / torn, enospc / eio, or a halt for the harness).
 *
 * Event ordinals (a point's identity) come from one counter per rank and attempt, an
 * 8-byte file mapped shared by every process of the rank (ord=FILE), so a child's events
 * are numbered in the same sequence as its parent's.
 *
 * What it cannot see: raw syscalls, static binaries, stdio streams (fopen/fwrite write
 * through glibc's internal symbols), and stores into a mapping until msync (an msync is
 * recorded as a write of the synced range's bytes, then an fdatasync).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 65536
#define MAXROOTS 8
#define MAXMAPS 256
#define PASS (-(1LL << 40))

enum { K_OPEN = 1, K_WRITE, K_PWRITE, K_FSYNC, K_FDATASYNC, K_TRUNCATE, K_RENAME, K_UNLINK, K_MKDIR,
       K_RMDIR, K_CLOSE, K_MSYNC };

typedef long long (*handler_t)(int kind, int fd, int dirfd, const char *path, const char *path2,
                               const void *buf, unsigned long long n, long long off, int flags, int mode);

static int configured;           /* 0: pass everything through */
static pid_t owner;              /* the process this state belongs to (see live()) */
static handler_t handler;        /* delegate mode when set */
static __thread int inside;      /* this thread is in the handler or in the shim's own I/O */
static char roots[MAXROOTS][PATH_MAX];
static size_t rootlen[MAXROOTS];
static int nroots;
static char *fdpath[MAXFD];      /* watched fds: the path they were opened with (absolute) */
static unsigned char fdisdir[MAXFD];
static struct { char *addr; size_t len; long long off; char *path; } maps[MAXMAPS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* standalone */
static int rank, attempt, tracefd = -1, datafd = -1;
static long long dataoff, seq;
static char tracedir[PATH_MAX];
static volatile long long *ordp;
static char pmode[32];
static long long pord = -1;
static int errored;

#define REAL(ret, name, ...) \
    static ret (*real_##name)(__VA_ARGS__); \
    if (!real_##name) real_##name = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

static ssize_t raw_write(int fd, const void *b, size_t n) {
    REAL(ssize_t, write, int, const void *, size_t);
    return real_write(fd, b, n);
}

static void write_all(int fd, const char *b, size_t n) {
    while (n) {
        ssize_t k = raw_write(fd, b, n);
        if (k <= 0) { if (k < 0 && errno == EINTR) continue; return; }
        b += k; n -= (size_t)k;
    }
}

/* ------------------------------------------------------------------ configuration */
static void parse(const char *conf) {
    char buf[8192];
    snprintf(buf, sizeof buf, "%s", conf);
    char *save = NULL;
    nroots = 0;
    for (char *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        const char *v = eq + 1;
        if (!strcmp(kv, "rank")) rank = atoi(v);
        else if (!strcmp(kv, "attempt")) attempt = atoi(v);
        else if (!strcmp(kv, "trace")) snprintf(tracedir, sizeof tracedir, "%s", v);
        else if (!strcmp(kv, "roots")) {
            char rb[4096], *s2 = NULL;
            snprintf(rb, sizeof rb, "%s", v);
            for (char *r = strtok_r(rb, ":", &s2); r && nroots < MAXROOTS; r = strtok_r(NULL, ":", &s2)) {
                snprintf(roots[nroots], PATH_MAX, "%s", r);
                rootlen[nroots] = strlen(roots[nroots]);
                nroots++;
            }
        } else if (!strcmp(kv, "ord")) {
            REAL(int, open, const char *, int, ...);
            int fd = real_open(v, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd >= 0) {
                struct stat st;
                if (fstat(fd, &st) == 0 && st.st_size < 8) ftruncate(fd, 8);
                void *p = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p != MAP_FAILED) ordp = (volatile long long *)p;
                REAL(int, close, int);
                real_close(fd);
            }
        } else if (!strcmp(kv, "point")) {
            const char *c = strrchr(v, ':');
            if (c) {
                snprintf(pmode, sizeof pmode, "%.*s", (int)(c - v), v);
                pord = atoll(c + 1);
            }
        }
    }
    configured = nroots > 0;
}

/* Called by the Python tracer (delegate mode), or at load from CHAOS_SHIM (standalone). */
int chaos_shim_configure(const char *conf) { inside++; parse(conf); inside--; return configured; }
void chaos_shim_register(handler_t h) { handler = h; }
void chaos_shim_off(void) { handler = NULL; configured = 0; }
/* The next event ordinal of this rank (shared by its processes); -1 without a counter. */
long long chaos_shim_next_ord(void) { return ordp ? __atomic_fetch_add(ordp, 1, __ATOMIC_SEQ_CST) : -1; }
int chaos_shim_watched(int fd) { return fd >= 0 && fd < MAXFD && fdpath[fd] != NULL; }

/* Whether the calling process owns this state. A child made by vfork (subprocess and
 * posix_spawn start children so) runs in its parent's memory until it execs, and no fork
 * handler runs for it: its dup2 onto stdout or its close must change nothing here, and it
 * must never call into the parent's Python. */
static int live(void) { return getpid() == owner; }

static void after_fork_child(void) {
    /* A forked child is its own process: no Python handler answers for it (the interposer
     * uninstalls itself there), so it traces standalone into its own file. */
    owner = getpid();
    handler = NULL;
    /* Only the forking thread lives on: a lock another thread held stays held forever. */
    pthread_mutex_init(&mu, NULL);
    REAL(int, close, int);
    if (tracefd >= 0) real_close(tracefd);  /* the parent's trace: the child writes its own */
    if (datafd >= 0) real_close(datafd);
    tracefd = datafd = -1;
    dataoff = seq = 0;
}

__attribute__((constructor)) static void init(void) {
    owner = getpid();
    pthread_atfork(NULL, NULL, after_fork_child);
    const char *conf = getenv("CHAOS_SHIM");
    if (conf && *conf) { inside++; parse(conf); inside--; }
}

/* ------------------------------------------------------------------ paths */
static int absolute(int dirfd, const char *p, char *out) {
    if (!p) return 0;
    if (p[0] == '/') { snprintf(out, PATH_MAX, "%s", p); return 1; }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t k = readlink(link, base, sizeof base - 1);
        if (k <= 0) return 0;
        base[k] = 0;
    }
    return snprintf(out, PATH_MAX, "%s/%s", base, p) < PATH_MAX;
}

/* Where a path with "." or ".." components or a linked parent really leads: its parent
 * resolved, its last name kept (an entry may not exist yet, or be a link itself). */
static void canon(char *abs) {
    char *slash = strrchr(abs, '/');
    if (!slash || slash == abs) return;
    *slash = 0;
    char dir[PATH_MAX], name[PATH_MAX];
    snprintf(name, sizeof name, "%s", slash + 1);
    if (!realpath(abs, dir)) { *slash = '/'; return; }
    if (!strcmp(name, "..") || !strcmp(name, ".")) {
        char whole[PATH_MAX];
        snprintf(whole, sizeof whole, "%s/%s", dir, name);
        if (realpath(whole, abs)) return;
    }
    snprintf(abs, PATH_MAX, "%s/%s", strcmp(dir, "/") ? dir : "", name);
}

static int under(const char *abs) {
    for (int i = 0; i < nroots; i++)
        if (!strncmp(abs, roots[i], rootlen[i]) && (abs[rootlen[i]] == '/' || abs[rootlen[i]] == 0)) return 1;
    return 0;
}

static int ours(int dirfd, const char *p, char *abs) {
    if (!configured || inside || !live() || !absolute(dirfd, p, abs)) return 0;
    if (!under(abs) && strstr(abs, "/.") == NULL) return 0;  /* only a dotted parent can lead into a root */
    if (handler) return 1;  /* the interposer resolves it, and decides */
    canon(abs);  /* standalone: the record names the real path, as the interposer's do */
    return under(abs);
}

static int watched(int fd) { return configured && !inside && fd >= 0 && fd < MAXFD && fdpath[fd] && live(); }

static void watch(int fd, const char *abs) {
    if (fd < 0 || fd >= MAXFD) return;
    pthread_mutex_lock(&mu);
    free(fdpath[fd]);
    fdpath[fd] = abs ? strdup(abs) : NULL;
    struct stat st;
    fdisdir[fd] = abs && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    pthread_mutex_unlock(&mu);
}

/* ------------------------------------------------------------------ standalone records */
/* Length of the valid UTF-8 sequence at s (1-4), or 0 where the byte starts none. */
static int utf8_len(const unsigned char *s) {
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 && s[0] >= 0xC2 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3
            : (s[0] & 0xF8) == 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))) return 0;
    return n;
}

/* A JSON string of a path, as Python's json.dumps(os.fsdecode(path)) writes it: a byte that
 * starts no valid UTF-8 sequence becomes its surrogate escape (\udcXX), so the record reads
 * back as the same name and a hostile one never breaks the line. */
static void json_str(char *o, size_t cap, const char *s) {
    size_t j = 0;
    if (j < cap) o[j++] = '"';
    while (s && *s && j + 8 < cap) {
        unsigned char c = (unsigned char)*s;
        int n = utf8_len((const unsigned char *)s);
        if (c == '"' || c == '\\') { o[j++] = '\\'; o[j++] = (char)c; s++; }
        else if (c < 0x20) { j += (size_t)snprintf(o + j, cap - j, "\\u%04x", c); s++; }
        else if (n == 0) { j += (size_t)snprintf(o + j, cap - j, "\\udc%02x", c); s++; }
        else { for (int i = 0; i < n; i++) o[j++] = s[i]; s += n; }
    }
    if (j < cap) o[j++] = '"';
    o[j < cap ? j : cap - 1] = 0;
}

static int open_trace(void) {
    if (tracefd >= 0) return 1;
    if (!tracedir[0]) return 0;
    char p[PATH_MAX + 64];
    REAL(int, open, const char *, int, ...);
    snprintf(p, sizeof p, "%s/trace-r%d-a%d-p%d.jsonl", tracedir, rank, attempt, (int)getpid());
    tracefd = real_open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    strcat(p, ".data");
    datafd = real_open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return tracefd >= 0;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* When this thread's current op began (set by before(), used by op_record()): an op's "ts" is
 * taken before its syscall, as the Python interposer's is, so ranks' traces merge in an order
 * the kernel could have seen even when a thread is descheduled before writing its line. */
static __thread double op_t0 = -1.0;

/* One record: {"event":EV, FIELDS, "seq":..,"rank":..,"pid":..,"ts":..}; FIELDS is preformatted JSON. */
static void emit_at(const char *event, const char *fields, double ts) {
    if (!open_trace()) return;
    char line[16384];
    pthread_mutex_lock(&mu);
    int k = snprintf(line, sizeof line, "{\"event\":\"%s\",%s,\"seq\":%lld,\"rank\":%d,\"pid\":%d,\"ts\":%.9f}\n",
                     event, fields, seq++, rank, (int)getpid(), ts);
    if (k > 0 && (size_t)k < sizeof line) write_all(tracefd, line, (size_t)k);
    pthread_mutex_unlock(&mu);
}

static void emit(const char *event, const char *fields) {
    double ts = mono();
    if (op_t0 >= 0) op_t0 = ts; /* a point fired before the op: the op's line sorts after it */
    emit_at(event, fields, ts);
}

static long long store(const void *b, size_t n) {
    if (datafd < 0 && !open_trace()) return -1;
    pthread_mutex_lock(&mu);
    long long off = dataoff;
    write_all(datafd, b, n);
    dataoff += (long long)n;
    pthread_mutex_unlock(&mu);
    return off;
}

static void die(void) { kill(getpid(), SIGKILL); for (;;) pause(); }

static void fired(const char *action, const char *op, long long ord, const char *path, const char *when) {
    char f[PATH_MAX * 2 + 256], jp[PATH_MAX * 2];
    json_str(jp, sizeof jp, path ? path : "");
    snprintf(f, sizeof f, "\"action\":\"%s\",\"op\":\"%s\",\"when\":\"%s\",\"ord\":%lld,\"path\":%s,\"via\":\"native\",\"native\":true",
             action, op, when, ord, path ? jp : "null");
    emit("fired", f);
}

static int is(const char *m) { return !strcmp(pmode, m); }
static int halt_mode(void) {
    return pmode[0] && !is("before") && !is("after") && !is("torn") && !is("enospc") && !is("eio") && !is("net")
           && strcmp(pmode, "requeue") && strcmp(pmode, "preempt") && strcmp(pmode, "node");
}

/* A corruption or power point after event N: leave a halt request and wait to be stopped. */
static void halt(const char *op, long long ord, const char *path) {
    fired("halt", op, ord, path, pmode);
    char tmp[PATH_MAX + 72], fin[PATH_MAX + 64], body[128];
    snprintf(fin, sizeof fin, "%s/halt-request-r%d-p%d.json", tracedir, rank, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    REAL(int, open, const char *, int, ...);
    int fd = real_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int k = snprintf(body, sizeof body, "{\"rank\":%d,\"ord\":%lld,\"ts\":%.9f}", rank, ord,
                         (double)t.tv_sec + t.tv_nsec / 1e9);
        write_all(fd, body, (size_t)k);
        REAL(int, close, int);
        real_close(fd);
        REAL(int, rename, const char *, const char *);
        real_rename(tmp, fin);
    }
    sleep(20);
    die();
}

/* Before event `op` of a standalone process: take its ordinal, fire a before / errno point.
 * Returns 0 to perform it, or an errno to fail it with. */
static int before(const char *op, const char *path, long long *ord, int needs_space) {
    *ord = chaos_shim_next_ord();
    op_t0 = mono();
    if (*ord == pord && (is("before") || (is("torn") && strcmp(op, "write")))) {
        fired("kill", op, *ord, path, "before");
        die();
    }
    if (*ord == pord && (is("enospc") || is("eio"))) {
        errored = 1;
        fired(is("enospc") ? "enospc" : (strstr(op, "sync") ? "fsync_fail" : "eio"), op, *ord, path, pmode);
        return is("enospc") ? ENOSPC : EIO;
    }
    if (errored && is("enospc") && needs_space) return ENOSPC;
    return 0;
}

static void after(const char *op, long long ord, const char *path) {
    if (ord != pord) return;
    if (is("after")) { fired("kill", op, ord, path, "after"); die(); }
    if (halt_mode()) halt(op, ord, path);
}

static void op_record(const char *op, long long ord, const char *path, const char *extra, int err) {
    char f[PATH_MAX * 2 + 1024], jp[PATH_MAX * 2], e[32] = "";
    json_str(jp, sizeof jp, path ? path : "");
    if (err) snprintf(e, sizeof e, ",\"error\":%d", err);
    snprintf(f, sizeof f, "\"op\":\"%s\",\"path\":%s,\"ord\":%lld,\"via\":\"native\",\"native\":true%s%s%s", op, jp, ord,
             extra && *extra ? "," : "", extra ? extra : "", e);
    emit_at("op", f, op_t0 >= 0 ? op_t0 : mono());
    op_t0 = -1.0;
}

/* ------------------------------------------------------------------ the calls */
static int flags_json(int fl, char *o, size_t cap) {
    int acc = fl & O_ACCMODE;
    return snprintf(o, cap, "[\"%s\"%s%s%s%s%s]", acc == O_WRONLY ? "wronly" : acc == O_RDWR ? "rdwr" : "rdonly",
                    fl & O_CREAT ? ",\"creat\"" : "", fl & O_EXCL ? ",\"excl\"" : "", fl & O_TRUNC ? ",\"trunc\"" : "",
                    fl & O_APPEND ? ",\"append\"" : "", fl & O_DIRECTORY ? ",\"directory\"" : "");
}

typedef int (*openat_t)(int, const char *, int, ...);

static int traced_open(int dirfd, const char *p, int fl, mode_t m, openat_t realat) {
    char abs[PATH_MAX];
    struct stat ds;
    int readonly = (fl & O_ACCMODE) == O_RDONLY && !(fl & (O_CREAT | O_TRUNC | O_DIRECTORY));
    if (!ours(dirfd, p, abs) || (readonly && !(stat(abs, &ds) == 0 && S_ISDIR(ds.st_mode)))) {
        int fd = realat(dirfd, p, fl, m);
        if (fd >= 0 && fd < MAXFD && fdpath[fd] && !inside && live()) watch(fd, NULL);  /* a reused number */
        return fd;
    }
    if (handler) {
        inside++;
        long long r = handler(K_OPEN, -1, dirfd, p, abs, NULL, 0, 0, fl, (int)m);
        inside--;
        if (r != PASS) {
            if (r < 0) { errno = (int)-r; return -1; }
            watch((int)r, abs);
            return (int)r;
        }
        int fd = realat(dirfd, p, fl, m);
        if (fd >= 0) watch(fd, abs);
        return fd;
    }
    struct stat st;
    int existed = stat(abs, &st) == 0;
    int creates = (fl & O_CREAT) && !existed;
    long long ord;
    int err = before("open", abs, &ord, creates);
    char fj[128], extra[256];
    flags_json(fl, fj, sizeof fj);
    if (err) {
        snprintf(extra, sizeof extra, "\"fd\":null,\"flags\":%s", fj);
        op_record("open", ord, abs, extra, err);
        errno = err;
        return -1;
    }
    inside++;
    int fd = realat(dirfd, p, fl, m);
    int e = errno;
    inside--;
    if (fd < 0) {
        snprintf(extra, sizeof extra, "\"fd\":null,\"flags\":%s", fj);
        op_record("open", ord, abs, extra, e);
        errno = e;
        return -1;
    }
    watch(fd, abs);
    snprintf(extra, sizeof extra, "\"fd\":%d,\"flags\":%s,\"created\":%s,\"trunc\":%s,\"is_dir\":%s", fd, fj,
             creates ? "true" : "false", (fl & O_TRUNC) && !fdisdir[fd] ? "true" : "false",
             fdisdir[fd] ? "true" : "false");
    op_record("open", ord, abs, extra, 0);
    after("open", ord, abs);
    return fd;
}

static int at_open(int d, const char *p, int fl, ...) {
    REAL(int, openat, int, const char *, int, ...);
    va_list a; va_start(a, fl); mode_t m = (fl & (O_CREAT | O_TMPFILE)) ? va_arg(a, int) : 0; va_end(a);
    return real_openat(d, p, fl, m);
}

#define MODE_ARG mode_t m = 0; if (fl & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, fl); m = va_arg(a, int); va_end(a); }
int open(const char *p, int fl, ...) { MODE_ARG; return traced_open(AT_FDCWD, p, fl, m, at_open); }
int open64(const char *p, int fl, ...) { MODE_ARG; return traced_open(AT_FDCWD, p, fl, m, at_open); }
int openat(int d, const char *p, int fl, ...) { MODE_ARG; return traced_open(d, p, fl, m, at_open); }
int openat64(int d, const char *p, int fl, ...) { MODE_ARG; return traced_open(d, p, fl, m, at_open); }
int creat(const char *p, mode_t m) { return traced_open(AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, m, at_open); }
int creat64(const char *p, mode_t m) { return traced_open(AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC, m, at_open); }

/* A write of n bytes at `off` (-1: the fd's position) through `real`. */
static ssize_t traced_write(int kind, int fd, const void *b, size_t n, off_t off,
                            ssize_t (*real)(int, const void *, size_t, off_t)) {
    if (handler) {
        inside++;
        long long r = handler(kind, fd, -1, NULL, NULL, b, n, (long long)off, 0, 0);
        inside--;
        if (r != PASS) {
            if (r < 0) { errno = (int)-r; return -1; }
            return (ssize_t)r;
        }
        return real(fd, b, n, off);
    }
    const char *path = fdpath[fd];
    long long at = off >= 0 ? (long long)off : (long long)lseek(fd, 0, SEEK_CUR);
    if (off < 0 && (fcntl(fd, F_GETFL) & O_APPEND)) { struct stat st; if (!fstat(fd, &st)) at = st.st_size; }
    long long ord;
    int err = before("write", path, &ord, 1);
    char extra[256];
    if (err) {
        snprintf(extra, sizeof extra, "\"fd\":%d,\"offset\":%lld,\"length\":%zu,\"data_off\":null", fd, at, n);
        op_record("write", ord, path, extra, err);
        errno = err;
        return -1;
    }
    size_t todo = n;
    int torn = ord == pord && is("torn") && n > 1;
    if (torn) todo = n / 2;
    inside++;
    ssize_t k = real(fd, b, todo, off);
    int e = errno;
    inside--;
    if (k < 0) {
        snprintf(extra, sizeof extra, "\"fd\":%d,\"offset\":%lld,\"length\":%zu,\"data_off\":null", fd, at, n);
        op_record("write", ord, path, extra, e);
        errno = e;
        return -1;
    }
    inside++;
    long long doff = store(b, (size_t)k);
    inside--;
    snprintf(extra, sizeof extra, "\"fd\":%d,\"offset\":%lld,\"length\":%zd,\"data_off\":%lld,\"data_len\":%zd%s",
             fd, at, k, doff, k, torn ? ",\"partial_of\":0" : "");
    if (torn) {
        char *pf = strstr(extra, "\"partial_of\":0");
        snprintf(pf, sizeof extra - (size_t)(pf - extra), "\"partial_of\":%zu", n);
    }
    op_record("write", ord, path, extra, 0);
    if (torn) { fired("kill", "write", ord, path, "torn"); die(); }
    after("write", ord, path);
    return k;
}

static ssize_t w_plain(int fd, const void *b, size_t n, off_t o) { (void)o; return raw_write(fd, b, n); }
static ssize_t w_pwrite(int fd, const void *b, size_t n, off_t o) {
    REAL(ssize_t, pwrite64, int, const void *, size_t, off_t);
    return real_pwrite64(fd, b, n, o);
}

ssize_t write(int fd, const void *b, size_t n) {
    if (!watched(fd)) return raw_write(fd, b, n);
    return traced_write(K_WRITE, fd, b, n, -1, w_plain);
}
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) {
    if (!watched(fd)) return w_pwrite(fd, b, n, o);
    return traced_write(K_PWRITE, fd, b, n, o, w_pwrite);
}
ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) {
    if (!watched(fd)) return w_pwrite(fd, b, n, o);
    return traced_write(K_PWRITE, fd, b, n, o, w_pwrite);
}

/* writev / pwritev: gathered into one buffer, one write event (as the kernel writes it). */
static ssize_t gathered(int kind, int fd, const struct iovec *v, int c, off_t o) {
    size_t n = 0;
    for (int i = 0; i < c; i++) n += v[i].iov_len;
    char *b = malloc(n ? n : 1);
    if (!b) { errno = ENOMEM; return -1; }
    size_t at = 0;
    for (int i = 0; i < c; i++) { memcpy(b + at, v[i].iov_base, v[i].iov_len); at += v[i].iov_len; }
    ssize_t k = traced_write(kind, fd, b, n, o, kind == K_WRITE ? w_plain : w_pwrite);
    free(b);
    return k;
}
ssize_t writev(int fd, const struct iovec *v, int c) {
    REAL(ssize_t, writev, int, const struct iovec *, int);
    if (!watched(fd)) return real_writev(fd, v, c);
    return gathered(K_WRITE, fd, v, c, -1);
}
ssize_t pwritev(int fd, const struct iovec *v, int c, off_t o) {
    REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t);
    if (!watched(fd)) return real_pwritev(fd, v, c, o);
    return gathered(K_PWRITE, fd, v, c, o);
}
ssize_t pwritev64(int fd, const struct iovec *v, int c, off_t o) {
    REAL(ssize_t, pwritev64, int, const struct iovec *, int, off_t);
    if (!watched(fd)) return real_pwritev64(fd, v, c, o);
    return gathered(K_PWRITE, fd, v, c, o);
}

/* fsync, fdatasync, ftruncate, close: one fd, no bytes. */
static int traced_fdop(int kind, const char *op, int fd, long long arg, int (*real)(int, long long)) {
    if (handler) {
        inside++;
        long long r = handler(kind, fd, -1, NULL, NULL, NULL, 0, arg, 0, 0);
        inside--;
        if (r != PASS) {
            if (kind == K_CLOSE) watch(fd, NULL);
            if (r < 0) { errno = (int)-r; return -1; }
            return (int)r;
        }
        int k = real(fd, arg);
        if (kind == K_CLOSE) watch(fd, NULL);
        return k;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", fdpath[fd]);
    int isdir = fdisdir[fd];
    long long ord;
    int err = before(op, path, &ord, kind == K_TRUNCATE);
    char extra[128];
    if (kind == K_TRUNCATE) snprintf(extra, sizeof extra, "\"fd\":%d,\"length\":%lld", fd, arg);
    else snprintf(extra, sizeof extra, "\"fd\":%d,\"is_dir\":%s", fd, isdir ? "true" : "false");
    if (err) { op_record(op, ord, path, extra, err); errno = err; return -1; }
    inside++;
    int k = real(fd, arg);
    int e = errno;
    inside--;
    if (kind == K_CLOSE) watch(fd, NULL);
    op_record(op, ord, path, extra, k < 0 ? e : 0);
    if (k < 0) { errno = e; return -1; }
    after(op, ord, path);
    return k;
}
static int r_fsync(int fd, long long a) { (void)a; REAL(int, fsync, int); return real_fsync(fd); }
static int r_fdatasync(int fd, long long a) { (void)a; REAL(int, fdatasync, int); return real_fdatasync(fd); }
static int r_ftruncate(int fd, long long a) { REAL(int, ftruncate64, int, off_t); return real_ftruncate64(fd, (off_t)a); }
static int r_close(int fd, long long a) { (void)a; REAL(int, close, int); return real_close(fd); }

int fsync(int fd) { return watched(fd) ? traced_fdop(K_FSYNC, "fsync", fd, 0, r_fsync) : r_fsync(fd, 0); }
int fdatasync(int fd) { return watched(fd) ? traced_fdop(K_FDATASYNC, "fdatasync", fd, 0, r_fdatasync) : r_fdatasync(fd, 0); }
int ftruncate(int fd, off_t l) { return watched(fd) ? traced_fdop(K_TRUNCATE, "truncate", fd, l, r_ftruncate) : r_ftruncate(fd, l); }
int ftruncate64(int fd, off_t l) { return watched(fd) ? traced_fdop(K_TRUNCATE, "truncate", fd, l, r_ftruncate) : r_ftruncate(fd, l); }
int close(int fd) {
    if (watched(fd)) return traced_fdop(K_CLOSE, "close", fd, 0, r_close);
    if (fd >= 0 && fd < MAXFD && fdpath[fd] && live()) watch(fd, NULL);
    return r_close(fd, 0);
}

/* rename, unlink, mkdir, rmdir: directory entries. */
static int traced_entry(int kind, const char *op, int d1, const char *a, int d2, const char *b, mode_t m,
                        int (*real)(void)) {
    char absa[PATH_MAX], absb[PATH_MAX];
    int oa = ours(d1, a, absa), ob = b ? ours(d2, b, absb) : 0;
    if (!oa && !ob) return real();
    if (handler) {
        inside++;
        long long r = handler(kind, -1, d1, a, b, NULL, 0, d2, 0, (int)m);
        inside--;
        if (r != PASS) {
            if (r < 0) { errno = (int)-r; return -1; }
            return (int)r;
        }
        return real();
    }
    const char *path = b ? (ob ? absb : absa) : absa;
    long long ord;
    int err = before(op, path, &ord, kind != K_UNLINK && kind != K_RMDIR);
    char extra[PATH_MAX * 4 + 64] = "";
    if (b) {
        char js[PATH_MAX * 2], jd[PATH_MAX * 2];
        json_str(js, sizeof js, absa);
        json_str(jd, sizeof jd, absb);
        snprintf(extra, sizeof extra, "\"src\":%s,\"dst\":%s", oa ? js : "null", ob ? jd : "null");
    }
    if (err) { op_record(op, ord, path, extra, err); errno = err; return -1; }
    inside++;
    int k = real();
    int e = errno;
    inside--;
    op_record(op, ord, path, extra, k < 0 ? e : 0);
    if (k < 0) { errno = e; return -1; }
    after(op, ord, path);
    (void)m;
    return k;
}

/* The real calls, with their arguments in thread-local slots so traced_entry stays one function. */
static __thread const char *ta, *tb;
static __thread int td1, td2;
static __thread mode_t tm;
static __thread unsigned tfl;
static int c_renameat2(void) {
    REAL(int, renameat2, int, const char *, int, const char *, unsigned);
    if (real_renameat2) return real_renameat2(td1, ta, td2, tb, tfl);
    REAL(int, renameat, int, const char *, int, const char *);
    return real_renameat(td1, ta, td2, tb);
}
static int c_unlinkat(void) { REAL(int, unlinkat, int, const char *, int); return real_unlinkat(td1, ta, (int)tfl); }
static int c_mkdirat(void) { REAL(int, mkdirat, int, const char *, mode_t); return real_mkdirat(td1, ta, tm); }

#define ARGS(a_, d1_, b_, d2_, m_, f_) (ta = (a_), td1 = (d1_), tb = (b_), td2 = (d2_), tm = (m_), tfl = (f_))
int rename(const char *a, const char *b) { ARGS(a, AT_FDCWD, b, AT_FDCWD, 0, 0); return traced_entry(K_RENAME, "rename", AT_FDCWD, a, AT_FDCWD, b, 0, c_renameat2); }
int renameat(int d1, const char *a, int d2, const char *b) { ARGS(a, d1, b, d2, 0, 0); return traced_entry(K_RENAME, "rename", d1, a, d2, b, 0, c_renameat2); }
int renameat2(int d1, const char *a, int d2, const char *b, unsigned f) { ARGS(a, d1, b, d2, 0, f); return traced_entry(K_RENAME, "rename", d1, a, d2, b, 0, c_renameat2); }
int unlink(const char *p) { ARGS(p, AT_FDCWD, NULL, AT_FDCWD, 0, 0); return traced_entry(K_UNLINK, "unlink", AT_FDCWD, p, AT_FDCWD, NULL, 0, c_unlinkat); }
int unlinkat(int d, const char *p, int f) { ARGS(p, d, NULL, AT_FDCWD, 0, (unsigned)f); return traced_entry(f & AT_REMOVEDIR ? K_RMDIR : K_UNLINK, f & AT_REMOVEDIR ? "rmdir" : "unlink", d, p, AT_FDCWD, NULL, 0, c_unlinkat); }
int rmdir(const char *p) { ARGS(p, AT_FDCWD, NULL, AT_FDCWD, 0, AT_REMOVEDIR); return traced_entry(K_RMDIR, "rmdir", AT_FDCWD, p, AT_FDCWD, NULL, 0, c_unlinkat); }
int mkdir(const char *p, mode_t m) { ARGS(p, AT_FDCWD, NULL, AT_FDCWD, m, 0); return traced_entry(K_MKDIR, "mkdir", AT_FDCWD, p, AT_FDCWD, NULL, m, c_mkdirat); }
int mkdirat(int d, const char *p, mode_t m) { ARGS(p, d, NULL, AT_FDCWD, m, 0); return traced_entry(K_MKDIR, "mkdir", d, p, AT_FDCWD, NULL, m, c_mkdirat); }

/* dup*: the copy writes to the same file. */
static int follow(int from, int to) {
    if (to >= 0 && to < MAXFD && to != from && live()) {
        const char *p = from >= 0 && from < MAXFD ? fdpath[from] : NULL;
        watch(to, p);
    }
    return to;
}
int dup(int fd) { REAL(int, dup, int); return follow(fd, real_dup(fd)); }
int dup2(int fd, int to) { REAL(int, dup2, int, int); return follow(fd, real_dup2(fd, to)); }
int dup3(int fd, int to, int fl) { REAL(int, dup3, int, int, int); return follow(fd, real_dup3(fd, to, fl)); }
int fcntl(int fd, int cmd, ...) {
    REAL(int, fcntl, int, int, ...);
    va_list a; va_start(a, cmd); long arg = va_arg(a, long); va_end(a);
    int k = real_fcntl(fd, cmd, arg);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) follow(fd, k);
    return k;
}
int fcntl64(int fd, int cmd, ...) {
    REAL(int, fcntl64, int, int, ...);
    va_list a; va_start(a, cmd); long arg = va_arg(a, long); va_end(a);
    int k = real_fcntl64 ? real_fcntl64(fd, cmd, arg) : fcntl(fd, cmd, arg);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) follow(fd, k);
    return k;
}

/* mmap / msync / munmap: a shared writable mapping of a watched file; its bytes reach the
 * record at msync, as a write of the synced range followed by an fdatasync. */
static void *traced_mmap(void *addr, size_t len, int prot, int fl, int fd, off_t off, void *r) {
    (void)addr;
    if (r != MAP_FAILED && configured && live() && fd >= 0 && fd < MAXFD && fdpath[fd] && (prot & PROT_WRITE) && (fl & MAP_SHARED)) {
        pthread_mutex_lock(&mu);
        for (int i = 0; i < MAXMAPS; i++)
            if (!maps[i].addr) { maps[i].addr = r; maps[i].len = len; maps[i].off = off; maps[i].path = strdup(fdpath[fd]); break; }
        pthread_mutex_unlock(&mu);
    }
    return r;
}
void *mmap(void *addr, size_t len, int prot, int fl, int fd, off_t off) {
    REAL(void *, mmap, void *, size_t, int, int, int, off_t);
    return traced_mmap(addr, len, prot, fl, fd, off, real_mmap(addr, len, prot, fl, fd, off));
}
void *mmap64(void *addr, size_t len, int prot, int fl, int fd, off_t off) {
    REAL(void *, mmap64, void *, size_t, int, int, int, off_t);
    return traced_mmap(addr, len, prot, fl, fd, off, real_mmap64(addr, len, prot, fl, fd, off));
}
int munmap(void *addr, size_t len) {
    REAL(int, munmap, void *, size_t);
    if (!live()) return real_munmap(addr, len);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXMAPS; i++)
        if (maps[i].addr == addr) { free(maps[i].path); maps[i].addr = NULL; maps[i].path = NULL; }
    pthread_mutex_unlock(&mu);
    return real_munmap(addr, len);
}
int msync(void *addr, size_t len, int fl) {
    REAL(int, msync, void *, size_t, int);
    if (!configured || inside || !live()) return real_msync(addr, len, fl);
    char *a = addr;
    char path[PATH_MAX] = "";
    long long foff = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAXMAPS; i++)
        if (maps[i].addr && a >= maps[i].addr && a + len <= maps[i].addr + maps[i].len) {
            snprintf(path, sizeof path, "%s", maps[i].path);
            foff = maps[i].off + (a - maps[i].addr);
            break;
        }
    pthread_mutex_unlock(&mu);
    if (!path[0]) return real_msync(addr, len, fl);
    if (handler) {
        inside++;
        long long r = handler(K_MSYNC, -1, -1, path, NULL, addr, len, foff, fl, 0);
        inside--;
        if (r != PASS) {
            if (r < 0) { errno = (int)-r; return -1; }
            return (int)r;
        }
        return real_msync(addr, len, fl);
    }
    long long ord;
    int err = before("write", path, &ord, 1);
    char extra[256];
    if (err) {
        snprintf(extra, sizeof extra, "\"fd\":null,\"offset\":%lld,\"length\":%zu,\"data_off\":null", foff, len);
        op_record("write", ord, path, extra, err);
        errno = err;
        return -1;
    }
    inside++;
    long long doff = store(addr, len);
    inside--;
    snprintf(extra, sizeof extra, "\"fd\":null,\"offset\":%lld,\"length\":%zu,\"data_off\":%lld,\"data_len\":%zu,\"mapped\":true",
             foff, len, doff, len);
    op_record("write", ord, path, extra, 0);
    after("write", ord, path);
    err = before("fdatasync", path, &ord, 0);
    if (err) { op_record("fdatasync", ord, path, "\"fd\":null,\"is_dir\":false", err); errno = err; return -1; }
    int k = real_msync(addr, len, fl);
    int e = errno;
    op_record("fdatasync", ord, path, "\"fd\":null,\"is_dir\":false", k < 0 ? e : 0);
    if (k < 0) { errno = e; return -1; }
    after("fdatasync", ord, path);
    return k;
}
