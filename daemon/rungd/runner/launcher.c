/* The compiled launcher: the same process as launcher.py, in C, for a cheaper start.
 *
 * launcher.py says what the launcher does and why (clone3 with CLONE_INTO_CGROUP and
 * CLONE_PARENT, the error pipe's C/P lines, the spare cgroups removed at end of file); this
 * file does exactly that, request for request, on the wire format launcher.py defines
 * (encode_start / encode_spare / decode). A copy of a small C process is made and exec'd in
 * about half the time a copy of a Python one takes, which is most of what a call waits for.
 *
 *     rungd-launcher FD         serve the daemon on socket FD until end of file
 *     rungd-launcher --source   print the digest of the launcher.c it was built from
 *
 * Built by the package's build hook (hatch_build.py) where a C compiler is present; the daemon
 * uses it only when its --source matches the launcher.c it ships, else launcher.py.
 *
 * No shell, no PATH of our own, no allocation after clone3 in the new process (it only reads
 * what the request already holds), and nothing a request says can make this process write
 * outside the descriptors it was given or the cgroups it was told of.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <grp.h>
#include <termios.h>

#ifndef RUNGD_SOURCE_DIGEST
#define RUNGD_SOURCE_DIGEST "unknown"
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef CLONE_PARENT
#define CLONE_PARENT 0x00008000
#endif
#define CLONE_INTO_CGROUP_ 0x200000000ULL
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#define MAX_FDS 250
#define MAX_BODY (64u << 20)   /* launcher.MAX_BODY: the daemon never sends more */
#define MAX_SPARES 1000
#define MAX_ITEMS (1u << 20)  /* launcher.MAX_ITEMS: arguments and environment entries together */
#define MAX_TARGET (1 << 20)  /* launcher.MAX_TARGET: the highest number a descriptor becomes */
#define INFINITY_ ((uint64_t)-1)  /* RLIM_INFINITY on the wire */
#define ERROR_PIPE (-1)  /* launcher.ERROR_PIPE: the target of the error pipe */
#define TERMINAL (-2)    /* launcher.TERMINAL: the target of the controlling terminal */

/* Flags of a start request (launcher.py: _MKDIR, _CGROUP, _USER, _LIMITS, _NO_NEW_PRIVS, _LABEL). */
enum { F_MKDIR = 1, F_CGROUP = 2, F_USER = 4, F_LIMITS = 8, F_NO_NEW_PRIVS = 16, F_LABEL = 32 };
#define LABEL_XATTR "user.rungd.call"  /* launcher.LABEL_XATTR */
#define MAX_LABEL 255                  /* launcher.MAX_LABEL */

struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
        set_tid, set_tid_size, cgroup;
};

/* A start request, decoded; every pointer points into the request's body (or its arrays). */
struct request {
    unsigned flags;
    uint32_t ntargets;
    int32_t *targets;
    uint32_t uid, gid, ngroups;
    gid_t *groups;
    unsigned present;     /* which of the six limits are set (bit i: RLIMITS[i]) */
    uint64_t limits[6];
    int err_target;       /* the index of the error pipe among the targets */
    int tty_target;       /* the index of the controlling terminal among them, or -1 */
    const unsigned char *label;  /* the call's id, for the cgroup (F_LABEL), not NUL-terminated */
    uint32_t label_size;
    char *cwd;
    char **argv;          /* NULL-terminated */
    char **env;           /* NULL-terminated, "KEY=VALUE" each, in a buffer of its own */
    char *env_buffer;
    int bad_cwd;          /* a NUL in it: EINVAL where it is used (workdir, chdir), as Python's */
    int bad_exec;         /* a NUL in argv or env, or a bad name: EINVAL at "exec", as execve */
};

static const int RLIMITS[6] = {RLIMIT_CPU, RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_CORE};

static char *spares[MAX_SPARES];
static size_t nspares;

/* ---- reading the body ---------------------------------------------------------------- */

struct cursor { const unsigned char *at, *end; int ok; };

static uint64_t take(struct cursor *c, size_t size) {
    uint64_t value = 0;
    if (!c->ok || (size_t)(c->end - c->at) < size) { c->ok = 0; return 0; }
    for (size_t i = 0; i < size; i++) value = (value << 8) | c->at[i];
    c->at += size;
    return value;
}

/* A length-prefixed string, copied NUL-terminated into `into` (which has room for it). */
static char *take_string(struct cursor *c, char **into, int *bad, size_t *length) {
    uint32_t size = (uint32_t)take(c, 4);
    if (!c->ok || (size_t)(c->end - c->at) < size) { c->ok = 0; return NULL; }
    char *text = *into;
    memcpy(text, c->at, size);
    text[size] = '\0';
    if (memchr(c->at, '\0', size)) *bad = 1;
    c->at += size;
    *into += size + 1;
    if (length) *length = size;
    return text;
}

/* Decode a start request (launcher.py's encode_start). Returns 0, or -1 if it is malformed. */
static int decode(unsigned char *body, size_t size, struct request *r, char *strings) {
    struct cursor c = {body + 1, body + size, 1};
    memset(r, 0, sizeof *r);
    r->flags = (unsigned)take(&c, 1);
    r->ntargets = (uint32_t)take(&c, 2);
    if (!c.ok || (r->flags >> 6) || r->ntargets == 0 || r->ntargets > MAX_FDS) return -1;
    r->targets = calloc(r->ntargets, sizeof *r->targets);
    if (!r->targets) return -1;
    r->err_target = r->tty_target = -1;
    for (uint32_t i = 0; i < r->ntargets; i++) {
        int32_t target = (int32_t)(uint32_t)take(&c, 4);
        if (target < TERMINAL || target > MAX_TARGET) return -1;
        if (target == ERROR_PIPE) {
            if (r->err_target >= 0) return -1;  /* exactly one error pipe */
            r->err_target = (int)i;
        }
        if (target == TERMINAL) {
            if (r->tty_target >= 0) return -1;  /* at most one terminal */
            r->tty_target = (int)i;
        }
        r->targets[i] = target;
    }
    if (r->err_target < 0) return -1;
    if (r->flags & F_USER) {
        r->uid = (uint32_t)take(&c, 4);
        r->gid = (uint32_t)take(&c, 4);
        r->ngroups = (uint32_t)take(&c, 2);
        r->groups = calloc(r->ngroups + 1, sizeof *r->groups);
        if (!r->groups) return -1;
        for (uint32_t i = 0; i < r->ngroups; i++) r->groups[i] = (gid_t)take(&c, 4);
    }
    if (r->flags & F_LIMITS) {
        r->present = (unsigned)take(&c, 1);
        if (r->present >> 6) return -1;
        for (int i = 0; i < 6; i++)
            if (r->present & (1u << i)) r->limits[i] = take(&c, 8);
    }
    if (r->flags & F_LABEL) {
        r->label_size = (uint32_t)take(&c, 4);
        if (!c.ok || !(r->flags & F_CGROUP) || r->label_size == 0 || r->label_size > MAX_LABEL
            || (size_t)(c.end - c.at) < r->label_size || memchr(c.at, '\0', r->label_size)) return -1;
        r->label = c.at;
        c.at += r->label_size;
    }
    char *into = strings;
    r->cwd = take_string(&c, &into, &r->bad_cwd, NULL);
    uint32_t argc = (uint32_t)take(&c, 4);
    if (!c.ok || argc == 0 || argc > MAX_ITEMS) return -1;
    r->argv = calloc(argc + 1, sizeof *r->argv);
    if (!r->argv) return -1;
    for (uint32_t i = 0; i < argc; i++) r->argv[i] = take_string(&c, &into, &r->bad_exec, NULL);
    /* As Python's execve (launcher.py, the specification): an empty program name is EINVAL. */
    if (c.ok && r->argv[0] && r->argv[0][0] == '\0') r->bad_exec = 1;
    uint32_t envc = (uint32_t)take(&c, 4);
    if (!c.ok || envc > MAX_ITEMS - argc) return -1;
    r->env = calloc(envc + 1, sizeof *r->env);
    /* Each pair becomes "KEY=VALUE": no longer than the two strings and their prefixes. */
    r->env_buffer = malloc(size + 1);
    if (!r->env || !r->env_buffer) return -1;
    char *pair = r->env_buffer;
    for (uint32_t i = 0; i < envc; i++) {
        size_t klen = 0, vlen = 0;
        char *key = take_string(&c, &into, &r->bad_exec, &klen);
        char *value = take_string(&c, &into, &r->bad_exec, &vlen);
        if (!c.ok) return -1;
        /* As Python's execve: an empty name, or one with '=' after its first character. */
        if (klen == 0 || (klen > 1 && memchr(key + 1, '=', klen - 1))) r->bad_exec = 1;
        r->env[i] = pair;
        memcpy(pair, key, klen);
        pair[klen] = '=';
        memcpy(pair + klen + 1, value, vlen + 1);
        pair += klen + vlen + 2;
    }
    return c.ok && c.at == c.end ? 0 : -1;
}

static void release(struct request *r) {
    free(r->targets);
    free(r->groups);
    free(r->argv);
    free(r->env);
    free(r->env_buffer);
}

/* ---- the error pipe ------------------------------------------------------------------- */

/* Returns -1 if it could not all be written (the daemon gave up on this call: nobody listens). */
static int say(int fd, const char *text) {
    size_t left = strlen(text);
    while (left) {
        ssize_t n = write(fd, text, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        text += n;
        left -= (size_t)n;
    }
    return 0;
}

static void report(int fd, int code, const char *where) {
    char line[64];
    snprintf(line, sizeof line, "%d:%s", code ? code : EIO, where);
    say(fd, line);
}

/* ---- the new process ------------------------------------------------------------------ */

/* mkdir -p, the last part 0700 (as os.makedirs(path, 0o700, exist_ok=True)). */
/* capget/capset as the kernel defines them (libcap is not needed for two calls). */
struct cap_header { uint32_t version; int pid; };
struct cap_data { uint32_t effective, permitted, inheritable; };
#define CAP_VERSION_3 0x20080522

static int clear_inheritable(void) {
    struct cap_header header = {CAP_VERSION_3, 0};
    struct cap_data data[2];
    if (syscall(SYS_capget, &header, data) < 0) return -1;
    if (!data[0].inheritable && !data[1].inheritable) return 0;
    data[0].inheritable = data[1].inheritable = 0;
    return (int)syscall(SYS_capset, &header, data);
}

static int make_folders(char *path) {
    size_t length = strlen(path);
    if (length == 0) { errno = ENOENT; return -1; }
    while (length > 1 && path[length - 1] == '/') path[--length] = '\0';  /* "a/b/" is "a/b" */
    for (char *slash = path + 1; *slash; slash++) {
        if (*slash != '/') continue;
        *slash = '\0';
        int failed = mkdir(path, 0777) < 0 && errno != EEXIST;
        *slash = '/';
        if (failed) return -1;
    }
    if (mkdir(path, 0700) == 0) return 0;
    struct stat st;
    int saved = errno;
    if (saved == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    errno = saved;
    return -1;
}

static const char *env_get(char **env, const char *name) {
    size_t n = strlen(name);
    for (; *env; env++)
        if (strncmp(*env, name, n) == 0 && (*env)[n] == '=') return *env + n + 1;
    return NULL;
}

/* execve, or as execvp over the request's own PATH: keep looking after "not here", remember
 * the first other reason. Never a shell: ENOEXEC is a failure like any other. */
static int exec_program(struct request *r) {
    const char *program = r->argv[0];
    if (strchr(program, '/')) {
        execve(program, r->argv, r->env);
        return errno;
    }
    const char *path = env_get(r->env, "PATH");
    if (!path) path = "/bin:/usr/bin";
    int failure = 0;
    char candidate[PATH_MAX];
    size_t plen = strlen(program);
    for (const char *start = path;; ) {
        const char *end = strchrnul(start, ':');
        size_t dlen = (size_t)(end - start);
        if (dlen == 0) { start = "."; dlen = 1; }
        int now = ENAMETOOLONG;  /* what execve says of a name longer than a path may be */
        if (dlen + 1 + plen < sizeof candidate) {
            memcpy(candidate, start, dlen);
            candidate[dlen] = '/';
            memcpy(candidate + dlen + 1, program, plen + 1);
            execve(candidate, r->argv, r->env);
            now = errno;
        }
        int not_here = now == ENOENT || now == ENOTDIR;
        if (failure == 0 || ((failure == ENOENT || failure == ENOTDIR) && !not_here)) failure = now;
        if (*end == '\0') break;
        start = end + 1;
    }
    return failure ? failure : ENOENT;
}

/* In the new process: leave the session, lay descriptors out, join, switch user, exec. */
static void become(struct request *r, int *fds, int sock_fd, int join_cgroup) {
    int err_w = fds[r->err_target], floor = 2, lifted[MAX_FDS];
    const char *where = "start";
    char line[32];
    for (uint32_t i = 0; i < r->ntargets; i++)
        if (r->targets[i] > floor) floor = r->targets[i];  /* at most MAX_TARGET: no overflow */
    close(sock_fd);
    snprintf(line, sizeof line, "C%d\n", (int)getpid());
    if (say(err_w, line) < 0) _exit(127);  /* nobody would learn of it: it must not run */
    setsid();  /* its own session and group: the call's kill signals the group */
    signal(SIGPIPE, SIG_DFL);
    floor += 1;
    /* Lift every descriptor above the numbers they must end up at, so laying them out never
     * overwrites one not placed yet; the lifted copies are close-on-exec. */
    for (uint32_t i = 0; i < r->ntargets; i++) {
        lifted[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, floor);
        if (lifted[i] < 0) { report(err_w, errno, where); _exit(127); }
    }
    err_w = lifted[r->err_target];
    for (uint32_t i = 0; i < r->ntargets; i++) close(fds[i]);
    for (uint32_t i = 0; i < r->ntargets; i++)
        if (r->targets[i] >= 0 && dup2(lifted[i], r->targets[i]) < 0) goto failed;
    if (r->tty_target >= 0) {
        /* The daemon's pseudo-terminal becomes the session's controlling terminal (launcher.py
         * says why here, before the user switch); the lifted copy closes at exec. */
        where = "terminal";
        if (ioctl(lifted[r->tty_target], TIOCSCTTY, 0) < 0) goto failed;
    }
    if (join_cgroup >= 0) {
        where = "cgroup";
        int procs = openat(join_cgroup, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (procs < 0 || write(procs, "0", 1) != 1) goto failed;
    }
    if (r->flags & F_USER) {  /* as subprocess does: groups, gid, then uid */
        where = "user";
        if (setgroups(r->ngroups, r->groups) < 0 || setregid(r->gid, r->gid) < 0
            || setreuid(r->uid, r->uid) < 0) goto failed;
    }
    if (r->flags & F_MKDIR) {
        /* As the program's user (launcher.py says why). */
        where = "workdir";
        if (r->bad_cwd) { errno = EINVAL; goto failed; }
        if (make_folders(r->cwd) < 0) goto failed;
    }
    /* As the program's user: its folder is its own (0700), which a daemon that is not root
     * (or root without CAP_DAC_OVERRIDE) may not enter. */
    where = "chdir";
    if (r->bad_cwd) { errno = EINVAL; goto failed; }
    if (chdir(r->cwd) < 0) goto failed;
    /* Capabilities the daemon was given to switch users (AmbientCapabilities=) are not the
     * program's: an ambient set survives exec, and setuid from one non-root user to another
     * keeps it, so a program run as postgres would hold CAP_SETUID. EINVAL: a kernel without
     * ambient capabilities (before 4.3) has none to pass on. */
    where = "capabilities";
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) goto failed;
    /* And the inheritable set: a program that execs a file with inheritable file
     * capabilities would gain those it names. Lowering a set needs no privilege. */
    if (clear_inheritable() < 0) goto failed;
    where = "limits";
    if (r->flags & F_LIMITS) {
        for (int i = 0; i < 6; i++) {
            if (!(r->present & (1u << i))) continue;
            rlim_t value = r->limits[i] == INFINITY_ ? RLIM_INFINITY : (rlim_t)r->limits[i];
            struct rlimit limit = {value, value};
            if (setrlimit(RLIMITS[i], &limit) < 0) goto failed;
        }
        if ((r->flags & F_NO_NEW_PRIVS) && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) goto failed;
    }
    where = "exec";
    if (r->bad_exec) { errno = EINVAL; goto failed; }
    errno = exec_program(r);
failed:
    report(err_w, errno, where);
    _exit(127);
}

/* ---- the launcher --------------------------------------------------------------------- */

/* Make one process for a request whose descriptors all came (checked by serve); returns
 * whether clone3 may be tried next time. */
static int start(struct request *r, int *fds, int sock_fd, int use_clone3) {
    int err_w = fds[r->err_target];
    int cgroup_fd = (r->flags & F_CGROUP) ? fds[r->ntargets] : -1;
    int join = cgroup_fd;
    long pid = -1;
    if (use_clone3) {
        /* No exit_signal: with CLONE_PARENT the kernel takes ours (SIGCHLD), and refuses any other. */
        struct clone_args_v2 args;
        memset(&args, 0, sizeof args);
        args.flags = CLONE_PARENT;
        if (cgroup_fd >= 0) {
            args.flags |= CLONE_INTO_CGROUP_;
            args.cgroup = (uint64_t)cgroup_fd;
        }
        pid = syscall(SYS_clone3, &args, sizeof args);
        int failure = pid < 0 ? errno : 0;
        if (pid >= 0) {
            join = -1;
        } else if (failure == ENOSYS || failure == E2BIG) {
            use_clone3 = 0;  /* no clone3 here (an old kernel, a seccomp filter): clone from now on */
        } else if (cgroup_fd < 0 || !(failure == EINVAL || failure == EOPNOTSUPP || failure == EPERM
                                      || failure == EBUSY || failure == ENODEV || failure == ENOENT)) {
            report(err_w, failure, "start");
            return use_clone3;
        }
        /* else: this cgroup could not be entered at birth; clone, and join it before exec */
    }
    if (pid < 0) {
#if defined(__s390x__) || defined(__s390__)
        pid = syscall(SYS_clone, 0, CLONE_PARENT | SIGCHLD, 0, 0, 0);  /* the stack comes first there */
#else
        pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
#endif
        if (pid < 0) {
            report(err_w, errno, "start");
            return use_clone3;
        }
    }
    if (pid == 0) become(r, fds, sock_fd, join);  /* never returns */
    char line[32];
    snprintf(line, sizeof line, "P%ld\n", pid);  /* at once: the new process may not run for a while */
    say(err_w, line);
    if ((r->flags & F_LABEL) && cgroup_fd >= 0) {
        /* Name the call the cgroup now holds, for a start-up after a crash (launcher.py's
         * _label says why here). */
        fsetxattr(cgroup_fd, LABEL_XATTR, r->label, r->label_size, 0);
    }
    return use_clone3;
}

static void remember_spare(const unsigned char *path, size_t size) {
    if (size == 0 || size >= PATH_MAX || memchr(path, '\0', size)) return;
    if (nspares >= MAX_SPARES) {  /* forget those removed since */
        size_t kept = 0;
        for (size_t i = 0; i < nspares; i++) {
            if (access(spares[i], F_OK) == 0) spares[kept++] = spares[i];
            else free(spares[i]);
        }
        nspares = kept;
        if (nspares >= MAX_SPARES) return;
    }
    char *copy = malloc(size + 1);
    if (!copy) return;
    memcpy(copy, path, size);
    copy[size] = '\0';
    for (size_t i = 0; i < nspares; i++)
        if (strcmp(spares[i], copy) == 0) { free(copy); return; }
    spares[nspares++] = copy;
}

static int read_exactly(int fd, unsigned char *into, size_t size) {
    while (size) {
        ssize_t n = recv(fd, into, size, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        into += n;
        size -= (size_t)n;
    }
    return 0;
}

/* One request's header and descriptors (received close-on-exec). Returns the number of
 * descriptors, or -1 at end of file or on a broken message. */
static int receive(int sock, uint32_t *size, uint32_t *count, int *fds) {
    unsigned char header[8];
    union { char buffer[CMSG_SPACE(MAX_FDS * sizeof(int))]; struct cmsghdr align; } control;
    struct iovec iov = {header, sizeof header};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buffer;
    msg.msg_controllen = sizeof control.buffer;
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    int nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t got = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < got && nfds < MAX_FDS; i++) memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    if (n <= 0) goto broken;
    if ((size_t)n < sizeof header && read_exactly(sock, header + n, sizeof header - (size_t)n) < 0) goto broken;
    *size = (uint32_t)header[0] << 24 | (uint32_t)header[1] << 16 | (uint32_t)header[2] << 8 | header[3];
    *count = (uint32_t)header[4] << 24 | (uint32_t)header[5] << 16 | (uint32_t)header[6] << 8 | header[7];
    return nfds;
broken:
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return -1;
}

static void serve(int sock) {
    int use_clone3 = 1, fds[MAX_FDS];
    for (;;) {
        uint32_t size = 0, count = 0;
        int nfds = receive(sock, &size, &count, fds);
        if (nfds < 0) return;  /* the daemon closed the socket: it is stopping, or gone */
        if (size == 0) {  /* no request at all: nothing to do */
            for (int i = 0; i < nfds; i++) close(fds[i]);
            continue;
        }
        unsigned char *body = size <= MAX_BODY ? malloc(size) : NULL;
        char *strings = body ? malloc(size) : NULL;
        if (!body || !strings || read_exactly(sock, body, size) < 0) {
            /* End of file, or a message no daemon of ours sends: stop; the daemon starts another. */
            for (int i = 0; i < nfds; i++) close(fds[i]);
            free(body);
            free(strings);
            return;
        }
        if (body[0] == 'S') {
            remember_spare(body + 1, size - 1);
        } else if (body[0] == 'R') {
            struct request r;
            /* Every descriptor the request names must have come with it: never a program
             * outside its cgroup, never a descriptor of an earlier request. */
            if (decode(body, size, &r, strings) == 0 && count <= (uint32_t)nfds
                && r.ntargets + ((r.flags & F_CGROUP) ? 1u : 0u) <= count)
                use_clone3 = start(&r, fds, sock, use_clone3);
            else
                fprintf(stderr, "rungd launcher: a request failed: malformed, or its descriptors did not all come\n");
            release(&r);
        } else {
            fprintf(stderr, "rungd launcher: a request failed: not a request\n");
        }
        for (int i = 0; i < nfds; i++) close(fds[i]);
        free(body);
        free(strings);
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--source") == 0) {
        puts(RUNGD_SOURCE_DIGEST);
        return 0;
    }
    char *end = NULL;
    long sock = argc == 2 ? strtol(argv[1], &end, 10) : -1;
    if (sock < 0 || sock > INT_MAX || !end || *end) {
        fprintf(stderr, "usage: rungd-launcher FD | --source (started by rungd, not by hand)\n");
        return 2;
    }
    fcntl((int)sock, F_SETFD, FD_CLOEXEC);
    /* What programs inherit: default dispositions and an empty mask. SIGPIPE stays ignored
     * here (a daemon that gave up on a call closes its end of the error pipe) and is reset in
     * each new process before exec. */
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    serve((int)sock);
    for (size_t i = 0; i < nspares; i++) rmdir(spares[i]);  /* in use or gone: left to the next start's sweep */
    /* Then the daemon's subtree each was in, once empty (launcher.py says why). */
    for (size_t i = 0; i < nspares; i++) {
        char *slash = strrchr(spares[i], '/');
        if (!slash || slash == spares[i]) continue;
        *slash = '\0';
        const char *base = strrchr(spares[i], '/');
        if (strncmp(base ? base + 1 : spares[i], "rungd-", 6) == 0) rmdir(spares[i]);
    }
    return 0;
}
