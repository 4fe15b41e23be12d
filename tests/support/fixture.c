/*
 * A private redis-server for tests and storms (see fixture.h).
 *
 * The server runs in the foreground as our child (fork + execvp), bound to
 * 127.0.0.1 only, on a port found by binding a socket to 127.0.0.1:0, in a
 * fresh mkdtemp directory, with persistence off. Its stdout/stderr go to
 * /dev/null and its log to <dir>/redis.log. Every wait here is bounded.
 *
 * If the server is started from the process's main thread it gets
 * PR_SET_PDEATHSIG(SIGKILL), so a crashed test does not leave servers behind.
 * (Not from other threads: Linux sends the signal when the *thread* that
 * forked exits, which would kill the server under a still-running test.)
 */
#define _GNU_SOURCE
#include "fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FX_REDIS_BIN "redis-server"
#define FX_HOST "127.0.0.1"
#define FX_START_WAIT_MS 10000  /* fixture.h: at most 10 s until PING */
#define FX_STOP_WAIT_MS 5000    /* fixture.h: SIGKILL after 5 s */
#define FX_START_TRIES 5        /* fresh ports tried by fx_redis_start */
#define FX_RESTART_WAIT_MS 15000 /* restart on the same port: total budget */

long long fx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void fx_sleep_ms(long ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A port that was free a moment ago on 127.0.0.1, or -1. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* 1 if port is free on 127.0.0.1 now (bind succeeds). */
static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A cluster node's port: free, with its cluster bus port (port + 10000,
 * which must stay below 65536) free too; -1 if none was found. The
 * kernel's ephemeral ports go up to 60999, so one in five would not do. */
static int free_cluster_port(void)
{
    for (int i = 0; i < 200; i++) {
        int p = free_port();
        if (p > 0 && p + 10000 <= 65535 && port_free(p + 10000))
            return p;
    }
    return -1;
}

/* Removes every file in dir (redis writes no subdirectories), then dir. */
static void remove_dir(const char *dir)
{
    if (!dir[0])
        return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0 && errno == EISDIR)
                remove_dir(path); /* redis 7's appendonlydir */
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Waits at most ms for pid to exit. 1 if reaped, 0 if still running. */
static int reap_within(pid_t pid, long ms)
{
    long long deadline = fx_now_ns() + ms * 1000000LL;
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD))
            return 1;
        if (fx_now_ns() >= deadline)
            return 0;
        fx_sleep_ms(10);
    }
}

/* SIGKILL and reap (a killed process cannot refuse; the wait is still bounded). */
static void kill_and_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    if (!reap_within(pid, FX_STOP_WAIT_MS))
        fprintf(stderr, "fixture: redis-server %d did not exit after SIGKILL\n", (int)pid);
}

static int ping_once(int port)
{
    struct timeval tv = { 0, 200000 };
    redisContext *c = redisConnectWithTimeout(FX_HOST, port, tv);
    if (!c)
        return 0;
    int ok = 0;
    if (!c->err) {
        redisSetTimeout(c, tv);
        redisReply *r = redisCommand(c, "PING");
        if (r) {
            /* a server with a password answers, but refuses the PING */
            ok = (r->type == REDIS_REPLY_STATUS && !strcasecmp(r->str, "PONG")) ||
                 (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOAUTH", 6));
            freeReplyObject(r);
        }
    }
    redisFree(c);
    return ok;
}

/* In a forked child: stdin, stdout and stderr on /dev/null (async-signal
 * safe). */
static void quiet_stdio(void)
{
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        if (nul > 2)
            close(nul);
    }
}

/*
 * Spawns redis-server on r->port in r->dir and waits until it answers PING,
 * at most wait_ms. 0 on success (r->pid set); -1 if it exited or never
 * answered (it is then killed and reaped, r->pid is 0).
 */
static int spawn(fx_redis *r, long wait_ms)
{
    char port[16], log[300], conf[300], mport[16];
    snprintf(port, sizeof port, "%d", r->port);
    snprintf(log, sizeof log, "%s/redis.log", r->dir);
    char *argv[64] = {FX_REDIS_BIN};
    int n = 1;
    if (r->opts.sentinel_master) {
        /* A sentinel rewrites its configuration file: a fresh one per start. */
        snprintf(conf, sizeof conf, "%s/sentinel.conf", r->dir);
        FILE *f = fopen(conf, "w");
        if (!f) {
            fprintf(stderr, "fixture: %s: %s\n", conf, strerror(errno));
            return -1;
        }
        fprintf(f, "sentinel monitor %s %s %d 2\n"
                   "sentinel down-after-milliseconds %s %d\n"
                   "sentinel failover-timeout %s %d\n",
                r->opts.sentinel_master, FX_HOST, r->opts.sentinel_master_port,
                r->opts.sentinel_master,
                r->opts.sentinel_down_ms ? r->opts.sentinel_down_ms : 1000,
                r->opts.sentinel_master,
                r->opts.sentinel_down_ms > 5000 ? r->opts.sentinel_down_ms : 5000);
        fclose(f);
        argv[n++] = conf;
        argv[n++] = "--sentinel";
    }
    char *base[] = {"--port", port, "--bind", FX_HOST, "--save", "", "--appendonly", "no",
                    "--dir", r->dir, "--daemonize", "no", "--logfile", log};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        argv[n++] = base[i];
    if (r->opts.unix_socket) {
        argv[n++] = "--unixsocket";
        argv[n++] = r->unix_path;
        argv[n++] = "--unixsocketperm";
        argv[n++] = "700";
    }
    if (r->opts.replica_of) {
        snprintf(mport, sizeof mport, "%d", r->opts.replica_of);
        argv[n++] = "--replicaof";
        argv[n++] = FX_HOST;
        argv[n++] = mport;
    }
    char nodes_conf[300];
    if (r->opts.cluster) {
        snprintf(nodes_conf, sizeof nodes_conf, "%s/nodes.conf", r->dir);
        argv[n++] = "--cluster-enabled";
        argv[n++] = "yes";
        argv[n++] = "--cluster-config-file";
        argv[n++] = nodes_conf;
        argv[n++] = "--cluster-node-timeout";
        argv[n++] = "2000";
    }
    if (r->opts.never_promote) {
        argv[n++] = "--replica-priority";
        argv[n++] = "0";
    }
    if (r->opts.requirepass) {
        argv[n++] = "--requirepass";
        argv[n++] = (char *)r->opts.requirepass;
    }
    for (int i = 0; r->opts.args && r->opts.args[i] && n < 62; i++)
        argv[n++] = (char *)r->opts.args[i];
    argv[n] = NULL;
    /* The environment with opts.env added (built before fork: the child
     * only execs). */
    extern char **environ;
    char *envbuf[256];
    char **envp = environ;
    if (r->opts.env) {
        int e = 0;
        for (int i = 0; r->opts.env[i] && e < 128; i++)
            envbuf[e++] = (char *)r->opts.env[i];
        int given = e;
        for (int i = 0; environ[i] && e < 255; i++) {
            const char *eq = strchr(environ[i], '=');
            size_t len = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
            int dup = 0;
            for (int j = 0; j < given && !dup; j++)
                dup = strncmp(envbuf[j], environ[i], len) == 0;
            if (!dup) /* one entry per name: ld.so takes the last LD_PRELOAD */
                envbuf[e++] = environ[i];
        }
        envbuf[e] = NULL;
        envp = envbuf;
    }
    /* Decided before fork: syscall() is fine in the child, but keep it simple. */
    int main_thread = (pid_t)syscall(SYS_gettid) == getpid();
    pid_t parent = getpid();

    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fixture: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls until exec. */
        quiet_stdio();
        if (main_thread) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
        }
        execvpe(FX_REDIS_BIN, argv, envp);
        _exit(127);
    }

    long long deadline = fx_now_ns() + wait_ms * 1000000LL;
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {  /* exited: port taken, or exec failed */
            r->pid = 0;
            return -1;
        }
        if (ping_once(r->port)) {
            r->pid = pid;
            return 0;
        }
        if (fx_now_ns() >= deadline)
            break;
        fx_sleep_ms(20);
    }
    fprintf(stderr, "fixture: redis-server on port %d did not answer PING in %ld ms\n",
            r->port, wait_ms);
    kill_and_reap(pid);
    r->pid = 0;
    return -1;
}

int fx_redis_start(fx_redis *r)
{
    return fx_redis_start_opts(r, NULL);
}

int fx_redis_start_opts(fx_redis *r, const fx_redis_opts *opts)
{
    memset(r, 0, sizeof *r);
    if (opts)
        r->opts = *opts;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0] || strlen(tmp) > 200)
        tmp = "/tmp";
    snprintf(r->dir, sizeof r->dir, "%s/dlock-fx-XXXXXX", tmp);
    if (!mkdtemp(r->dir)) {
        fprintf(stderr, "fixture: mkdtemp %s: %s\n", r->dir, strerror(errno));
        r->dir[0] = '\0';
        return -1;
    }
    if (r->opts.unix_socket)
        snprintf(r->unix_path, sizeof r->unix_path, "%s/redis.sock", r->dir);
    long long deadline = fx_now_ns() + (long long)FX_START_WAIT_MS * 1000000LL;
    for (int i = 0; i < FX_START_TRIES; i++) {
        r->port = r->opts.cluster ? free_cluster_port() : free_port();
        if (r->port <= 0)
            continue;
        long left = (long)((deadline - fx_now_ns()) / 1000000LL);
        if (left < 500)
            left = 500;
        if (spawn(r, left) == 0)
            return 0;
    }
    fprintf(stderr, "fixture: could not start %s (log: %s/redis.log)\n", FX_REDIS_BIN, r->dir);
    remove_dir(r->dir);
    r->dir[0] = '\0';
    r->port = 0;
    return -1;
}

void fx_redis_stop(fx_redis *r)
{
    if (r->pid > 0) {
        pid_t pid = r->pid;
        kill(pid, SIGCONT);  /* a SIGSTOPped server would never handle SIGTERM */
        kill(pid, SIGTERM);
        if (!reap_within(pid, FX_STOP_WAIT_MS))
            kill_and_reap(pid);
        r->pid = 0;
    }
    remove_dir(r->dir);
    r->dir[0] = '\0';
}

int fx_redis_signal(fx_redis *r, int sig)
{
    if (r->pid <= 0)
        return -1;
    if (kill(r->pid, sig) != 0)
        return -1;
    if (sig == SIGKILL) {
        if (!reap_within(r->pid, FX_STOP_WAIT_MS))
            return -1;
        r->pid = 0;
    }
    return 0;
}

int fx_redis_start_set(fx_redis *srv, int n, char *nodes, size_t size)
{
    size_t at = 0;
    if (nodes && size)
        nodes[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (fx_redis_start(&srv[i]) != 0)
            return -1;
        if (nodes && at < size)
            at += (size_t)snprintf(nodes + at, size - at, "%s127.0.0.1:%d", i ? "," : "",
                                   srv[i].port);
    }
    return 0;
}

int fx_redis_restore_set(fx_redis *srv, int n)
{
    for (int i = 0; i < n; i++) {
        if (srv[i].pid > 0)
            fx_redis_signal(&srv[i], SIGCONT);
        else if (fx_redis_restart(&srv[i]) != 0)
            return -1;
    }
    return 0;
}

void fx_redis_stop_set(fx_redis *srv, int n)
{
    for (int i = 0; i < n; i++)
        fx_redis_stop(&srv[i]);
}

int fx_redis_restart(fx_redis *r)
{
    if (r->pid > 0 && fx_redis_signal(r, SIGKILL) != 0)
        return -1;
    if (r->port <= 0 || !r->dir[0])
        return -1;
    /* The port may linger briefly (TIME_WAIT; redis sets SO_REUSEADDR, so this
     * is rare); retry on the same port within a bounded budget. */
    long long deadline = fx_now_ns() + (long long)FX_RESTART_WAIT_MS * 1000000LL;
    for (;;) {
        long left = (long)((deadline - fx_now_ns()) / 1000000LL);
        if (left <= 0)
            break;
        if (spawn(r, left < FX_START_WAIT_MS ? left : FX_START_WAIT_MS) == 0)
            return 0;
        fx_sleep_ms(100);
    }
    fprintf(stderr, "fixture: could not restart redis-server on port %d (log: %s/redis.log)\n",
            r->port, r->dir);
    return -1;
}

fx_redis fx_server;

int fx_group_setup(void **state)
{
    (void)state;
    return fx_redis_start(&fx_server) == 0 ? 0 : -1;
}

int fx_group_teardown(void **state)
{
    (void)state;
    fx_redis_stop(&fx_server);
    return 0;
}

int fx_ensure_server(void **state)
{
    (void)state;
    if (fx_server.pid > 0)
        return fx_redis_signal(&fx_server, SIGCONT) == 0 ? 0 : -1;
    return fx_redis_restart(&fx_server) == 0 ? 0 : -1;
}

redisContext *fx_connect(const char *host, int port)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (!c)
        return NULL;
    if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* The text of INFO <section>, malloc'd, or NULL. */
static char *info(const char *host, int port, const char *section)
{
    redisContext *c = fx_connect(host, port);
    if (!c)
        return NULL;
    char *out = NULL;
    redisReply *r = redisCommand(c, "INFO %s", section);
    if (r && r->type == REDIS_REPLY_STRING)
        out = strdup(r->str);
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return out;
}

/* Calls of cmd (NULL: every command but INFO) in one INFO commandstats
 * text. */
static long long calls_in(const char *text, const char *cmd)
{
    long long total = 0;
    const char *p = text;
    static const char tag[] = "cmdstat_";
    while ((p = strstr(p, tag)) != NULL) {
        /* Only at the start of a line. */
        if (p != text && p[-1] != '\n') {
            p += sizeof tag - 1;
            continue;
        }
        const char *name = p + sizeof tag - 1;
        const char *colon = strchr(name, ':');
        if (!colon)
            break;
        size_t n = (size_t)(colon - name);
        const char *calls = strstr(colon, "calls=");
        const char *eol = strchr(colon, '\n');
        p = colon;
        if (!calls || (eol && calls > eol))
            continue;
        long long v = strtoll(calls + 6, NULL, 10);
        if (cmd) {
            if (strlen(cmd) == n && !strncasecmp(name, cmd, n))
                total += v;
        } else if (!(n == 4 && !strncasecmp(name, "info", 4))) {
            total += v;
        }
    }
    return total;
}

long long fx_info_calls(const char *host, int port, const char *cmd)
{
    char *text = info(host, port, "commandstats");
    if (!text)
        return -1;
    long long total = calls_in(text, cmd);
    free(text);
    return total;
}

/* Both below read one snapshot: a subscriber's keepalive PING between two
 * reads would otherwise count as a lock call (or as minus one). */
long long fx_info_lock_calls(const char *host, int port)
{
    char *text = info(host, port, "commandstats");
    if (!text)
        return -1;
    long long v = calls_in(text, NULL) - calls_in(text, "subscribe") - calls_in(text, "ping");
    free(text);
    return v;
}

long long fx_info_top_calls(const char *host, int port)
{
    static const char *const top[] = {"evalsha", "eval", "script|load", "script|exists",
                                      "script|flush", "auth", "select", "ping",
                                      "subscribe"};
    char *text = info(host, port, "commandstats");
    if (!text)
        return -1;
    long long total = 0;
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        total += calls_in(text, top[i]);
    free(text);
    return total;
}

static double field_double(const char *text, const char *key)
{
    const char *p = text;
    size_t k = strlen(key);
    while ((p = strstr(p, key)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[k] == ':')
            return strtod(p + k + 1, NULL);
        p += k;
    }
    return -1;
}

double fx_info_cpu(const char *host, int port)
{
    char *text = info(host, port, "cpu");
    if (!text)
        return -1;
    double sys = field_double(text, "used_cpu_sys");
    double user = field_double(text, "used_cpu_user");
    free(text);
    if (sys < 0 || user < 0)
        return -1;
    return sys + user;
}

int fx_wait_subscriber(dlock_client *c)
{
    for (int i = 0; i < 1000; i++) {
        dlock_stats st;
        if (dlock_client_stats(c, &st) == DLOCK_OK && st.subscriber_commands > 0)
            return 0;
        fx_sleep_ms(10);
    }
    return -1;
}

int fx_wait_channel(const fx_redis *r, const char *channel)
{
    redisContext *k = fx_connect(FX_HOST, r->port);
    if (!k)
        return -1;
    int rc = -1;
    for (int i = 0; i < 1000 && rc != 0; i++) {
        redisReply *x = redisCommand(k, "PUBSUB NUMSUB %s", channel);
        if (x && x->type == REDIS_REPLY_ARRAY && x->elements == 2 &&
            x->element[1]->type == REDIS_REPLY_INTEGER && x->element[1]->integer > 0)
            rc = 0;
        if (x)
            freeReplyObject(x);
        else
            break; /* the connection failed */
        if (rc != 0)
            fx_sleep_ms(10);
    }
    redisFree(k);
    return rc;
}

uint64_t fx_entries_settled(dlock_client *c)
{
    dlock_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 10000; i++) {
        if (dlock_client_stats(c, &st) != DLOCK_OK)
            return UINT64_MAX;
        if (st.entries == 0)
            return 0;
        fx_sleep_ms(1);
    }
    return st.entries;
}

void fx_config(dlock_config *cfg, const fx_redis *r)
{
    dlock_config_init(cfg);
    cfg->redis_host = FX_HOST;
    cfg->redis_port = r->port;
    cfg->connect_timeout_ms = 500;
    cfg->command_timeout_ms = 1000;
    /* DLOCK_TEST_PROTOCOL=1: the clients write protocol 1, not the
     * default 2 (the suites that run that way: tests/CMakeLists.txt,
     * "_p1"; a test that sets cfg->protocol itself overrides it) */
    const char *p = getenv("DLOCK_TEST_PROTOCOL");
    if (p && *p)
        cfg->protocol = (uint32_t)atoi(p);
}

/* ------------------------------------------------------------------ */
/* A fake server clock                                                  */

int fx_fake_clock_init(fx_fake_clock *k, const char *shim, const char *faketime)
{
    memset(k, 0, sizeof *k);
    if (access(shim, R_OK) != 0 || access(faketime, R_OK) != 0) {
        fprintf(stderr, "fixture: %s or %s is missing\n", shim, faketime);
        return -1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(k->path, sizeof k->path, "%s/dlock-fx-clock-%d-%p",
             tmp && tmp[0] && strlen(tmp) < 200 ? tmp : "/tmp", (int)getpid(), (void *)k);
    extern char **environ;
    for (int i = 0; environ[i];) {
        char name[128];
        size_t n = strcspn(environ[i], "=");
        if (!strncmp(environ[i], "FAKETIME", 8) && n < sizeof name) {
            memcpy(name, environ[i], n);
            name[n] = '\0';
            unsetenv(name);
        } else {
            i++;
        }
    }
    snprintf(k->preload, sizeof k->preload, "LD_PRELOAD=%s:%s", shim, faketime);
    snprintf(k->file_env, sizeof k->file_env, "FAKETIME_TIMESTAMP_FILE=%s", k->path);
    const char *env[] = {k->preload, k->file_env, "FAKETIME_NO_CACHE=1",
                         "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_DISABLE_SHM=1",
                         "NO_FAKE_STAT=1", NULL};
    memcpy(k->env, env, sizeof env);
    return fx_fake_clock_set(k, 0);
}

int fx_fake_clock_set(fx_fake_clock *k, long offset_ms)
{
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", k->path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "fixture: %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "%+.3f\n", (double)offset_ms / 1000.0);
    if (fclose(f) != 0 || rename(tmp, k->path) != 0) {
        fprintf(stderr, "fixture: %s: %s\n", k->path, strerror(errno));
        return -1;
    }
    return 0;
}

void fx_fake_clock_remove(fx_fake_clock *k)
{
    if (k->path[0])
        unlink(k->path);
}

/* ------------------------------------------------------------------ */
/* Sentinel topology                                                    */

redisReply *fx_cmd_at(int port, const char *fmt, ...)
{
    redisContext *c = fx_connect(FX_HOST, port);
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

int fx_is_master(int port)
{
    redisReply *r = fx_cmd_at(port, "ROLE");
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    return m;
}

int fx_sentinel_reported(fx_sentinel_set *t, int i)
{
    redisReply *r = fx_cmd_at(t->sentinel[i].port, "SENTINEL get-master-addr-by-name %s", t->name);
    int p = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        p = atoi(r->element[1]->str);
    if (r)
        freeReplyObject(r);
    return p;
}

/* 1 if the text that `cmd` (INFO or CLUSTER INFO) returns at port holds
 * both a and b. */
static int reply_has(int port, const char *cmd, const char *a, const char *b)
{
    redisReply *r = fx_cmd_at(port, cmd);
    int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, a) && strstr(r->str, b);
    if (r)
        freeReplyObject(r);
    return ok;
}

/* 1 if the server at port is a replica whose link to its master is up. */
static int replica_linked(int port)
{
    return reply_has(port, "INFO replication", "role:slave", "master_link_status:up");
}

/* 1 if sentinel i sees the master as healthy, with a replica and the
 * other sentinels. */
static int sentinel_ready(fx_sentinel_set *t, int i)
{
    redisReply *r = fx_cmd_at(t->sentinel[i].port, "SENTINEL master %s", t->name);
    int ok = r && r->type == REDIS_REPLY_ARRAY;
    for (size_t k = 0; ok && k + 1 < r->elements; k += 2) {
        const char *f = r->element[k]->str, *v = r->element[k + 1]->str;
        if ((strcmp(f, "num-slaves") == 0 && atoi(v) < t->nsrv - 1) ||
            (strcmp(f, "num-other-sentinels") == 0 && atoi(v) < FX_SENTINELS - 1) ||
            (strcmp(f, "flags") == 0 && strcmp(v, "master") != 0))
            ok = 0;
    }
    if (r)
        freeReplyObject(r);
    return ok;
}

/* 1 if a write on the master at port is acknowledged by a replica within
 * 500 ms (a key set and deleted, then WAIT 1): a replica linked may not
 * acknowledge yet, and a client with min_replicas would fail its first
 * grants (WAIT falls short). */
static int replica_acks(int port)
{
    redisContext *c = fx_connect(FX_HOST, port);
    if (!c)
        return 0;
    int ok = 0;
    redisReply *r = redisCommand(c, "SET fx:ack 1");
    if (r)
        freeReplyObject(r);
    r = redisCommand(c, "DEL fx:ack");
    if (r)
        freeReplyObject(r);
    r = redisCommand(c, "WAIT 1 500");
    ok = r && r->type == REDIS_REPLY_INTEGER && r->integer >= 1;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

int fx_sentinel_wait(fx_sentinel_set *t, int master_port, int replica_port)
{
    for (int n = 0; n < 3000; n++) {
        int ok = fx_is_master(master_port) && replica_linked(replica_port) &&
                 replica_acks(master_port);
        for (int i = 0; ok && i < FX_SENTINELS; i++)
            ok = fx_sentinel_reported(t, i) == master_port && sentinel_ready(t, i);
        if (ok)
            return 0;
        fx_sleep_ms(10);
    }
    fprintf(stderr, "fixture: sentinel topology not ready: master %d (%s), replica %d (%s)\n",
            master_port, fx_is_master(master_port) ? "a master" : "not a master", replica_port,
            replica_linked(replica_port) ? "linked" : "not linked");
    for (int i = 0; i < FX_SENTINELS; i++) {
        redisReply *r = fx_cmd_at(t->sentinel[i].port, "SENTINEL master %s", t->name);
        fprintf(stderr, "fixture: sentinel %d names master %d:", i, fx_sentinel_reported(t, i));
        for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k + 1 < r->elements; k += 2)
            if (!strcmp(r->element[k]->str, "flags") ||
                !strcmp(r->element[k]->str, "num-slaves") ||
                !strcmp(r->element[k]->str, "num-other-sentinels"))
                fprintf(stderr, " %s %s", r->element[k]->str, r->element[k + 1]->str);
        fprintf(stderr, "\n");
        if (r)
            freeReplyObject(r);
    }
    return -1;
}

int fx_sentinel_master_port(fx_sentinel_set *t)
{
    for (int i = 0; i < t->nsrv; i++)
        if (fx_is_master(t->srv[i].port))
            return t->srv[i].port;
    return t->srv[0].port;
}

int fx_sentinel_replica_port(fx_sentinel_set *t)
{
    int m = fx_sentinel_master_port(t);
    return m == t->srv[0].port ? t->srv[1].port : t->srv[0].port;
}

int fx_sentinel_start(fx_sentinel_set *t, const char *name)
{
    return fx_sentinel_start_n(t, name, 1, 0);
}

int fx_sentinel_start_n(fx_sentinel_set *t, const char *name, int replicas, int down_ms)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nsrv = replicas >= 2 ? 3 : 2;
    if (fx_redis_start(&t->srv[0]) != 0)
        return -1;
    for (int i = 1; i < t->nsrv; i++) {
        fx_redis_opts ro = {.replica_of = t->srv[0].port, .never_promote = i == 2};
        if (fx_redis_start_opts(&t->srv[i], &ro) != 0)
            goto fail;
    }
    size_t n = 0;
    for (int i = 0; i < FX_SENTINELS; i++) {
        fx_redis_opts so = {.sentinel_master = t->name, .sentinel_master_port = t->srv[0].port,
                            .sentinel_down_ms = down_ms};
        if (fx_redis_start_opts(&t->sentinel[i], &so) != 0)
            goto fail;
        n += (size_t)snprintf(t->addrs + n, sizeof t->addrs - n, "%s%s:%d", i ? "," : "",
                              FX_HOST, t->sentinel[i].port);
    }
    if (fx_sentinel_wait(t, t->srv[0].port, t->srv[1].port) == 0)
        return 0;
fail:
    fx_sentinel_stop(t);
    return -1;
}

void fx_sentinel_stop(fx_sentinel_set *t)
{
    for (int i = 0; i < FX_SENTINELS; i++)
        if (t->sentinel[i].dir[0])
            fx_redis_stop(&t->sentinel[i]);
    for (int i = 2; i >= 0; i--)
        if (t->srv[i].dir[0])
            fx_redis_stop(&t->srv[i]);
}

/* ------------------------------------------------------------------ */
/* Redis Cluster                                                        */

/* 1 if the node at port says cluster_state:ok with every slot assigned. */
static int cluster_ok(int port)
{
    return reply_has(port, "CLUSTER INFO", "cluster_state:ok", "cluster_slots_ok:16384");
}

int fx_cluster_start(fx_cluster *c, int masters, int replicas)
{
    memset(c, 0, sizeof *c);
    int total = masters * (1 + replicas);
    if (masters < 3 || total > FX_CLUSTER_MAX) {
        fprintf(stderr, "fixture: a cluster needs 3 masters or more, %d nodes at most\n",
                FX_CLUSTER_MAX);
        return -1;
    }
    fx_redis_opts o = {.cluster = 1};
    size_t len = 0;
    for (; c->n < total; c->n++) {
        if (fx_redis_start_opts(&c->node[c->n], &o) != 0)
            goto fail;
        len += (size_t)snprintf(c->addrs + len, sizeof c->addrs - len, "%s%s:%d",
                                c->n ? "," : "", FX_HOST, c->node[c->n].port);
    }
    /* redis-cli --cluster create 127.0.0.1:p ... --cluster-replicas R --cluster-yes */
    char addr[FX_CLUSTER_MAX][24], reps[8];
    char *argv[FX_CLUSTER_MAX + 8];
    int a = 0;
    argv[a++] = "redis-cli";
    argv[a++] = "--cluster";
    argv[a++] = "create";
    for (int i = 0; i < total; i++) {
        snprintf(addr[i], sizeof addr[i], "%s:%d", FX_HOST, c->node[i].port);
        argv[a++] = addr[i];
    }
    snprintf(reps, sizeof reps, "%d", replicas);
    argv[a++] = "--cluster-replicas";
    argv[a++] = reps;
    argv[a++] = "--cluster-yes";
    argv[a] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        goto fail;
    if (pid == 0) {
        quiet_stdio();
        execvp("redis-cli", argv);
        _exit(127);
    }
    if (!reap_within(pid, 30000)) {
        kill_and_reap(pid);
        fprintf(stderr, "fixture: redis-cli --cluster create did not finish in 30 s\n");
        goto fail;
    }
    for (int t = 0; t < 3000; t++) {
        int ok = 1;
        for (int i = 0; ok && i < total; i++)
            ok = cluster_ok(c->node[i].port);
        if (ok)
            return 0;
        fx_sleep_ms(10);
    }
    fprintf(stderr, "fixture: the cluster did not reach cluster_state:ok in 30 s\n");
fail:
    fx_cluster_stop(c);
    return -1;
}

void fx_cluster_stop(fx_cluster *c)
{
    for (int i = c->n - 1; i >= 0; i--)
        fx_redis_stop(&c->node[i]);
    c->n = 0;
}

/* A string reply's text, malloc'd, or NULL for any other reply (freed). */
static char *reply_str(redisReply *r)
{
    char *s = NULL;
    if (r && r->type == REDIS_REPLY_STRING)
        s = strdup(r->str);
    if (r)
        freeReplyObject(r);
    return s;
}

/* The server's TIME in ms, or -1. */
static long long server_ms(redisContext *c)
{
    redisReply *r = redisCommand(c, "TIME");
    long long now = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        now = atoll(r->element[0]->str) * 1000 + atoll(r->element[1]->str) / 1000;
    if (r)
        freeReplyObject(r);
    return now;
}

int fx_key_protocol(redisContext *c, const char *key)
{
    redisReply *r = redisCommand(c, "TYPE %s", key);
    int hash = r && r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "hash");
    if (r)
        freeReplyObject(r);
    if (!hash)
        return 0;
    char *pv = reply_str(redisCommand(c, "HGET %s pv", key));
    /* protocol 2 marks every hash it writes; protocol 1's lease has an
     * owner and a token (and pv 1 since 0.2.0, none before); any other
     * mark is a protocol of neither layout */
    int p = !pv || !strcmp(pv, "1") ? 1 : !strcmp(pv, "2") ? 2 : 0;
    free(pv);
    return p;
}

/* Word `n` (0-based) of protocol 2's grant field g of key, malloc'd, or
 * NULL (no g, or released: ''). */
static char *p2_grant_word(redisContext *c, const char *key, int n)
{
    char *g = reply_str(redisCommand(c, "HGET %s g", key));
    if (!g)
        return NULL;
    char *w = g, *out = NULL;
    for (int i = 0; i < n && w; i++) {
        w = strchr(w, ' ');
        w = w ? w + 1 : NULL;
    }
    if (w && *w && *w != ' ')
        out = strndup(w, strcspn(w, " "));
    free(g);
    return out;
}

char *fx_grant_get(redisContext *c, const char *key, const char *what)
{
    int p = fx_key_protocol(c, key);
    int owner = !strcmp(what, "owner");
    if (p == 1)
        return reply_str(redisCommand(c, "HGET %s %s", key, owner ? "owner" : "token"));
    if (p != 2)
        return NULL;
    char *token = p2_grant_word(c, key, 0);
    if (!token || !owner)
        return token;
    free(token);
    return reply_str(redisCommand(c, "HGET %s o", key));
}

long long fx_lease_ms(redisContext *c, const char *key)
{
    int p = fx_key_protocol(c, key);
    char *exp = p == 1 ? reply_str(redisCommand(c, "HGET %s exp", key))
              : p == 2 ? p2_grant_word(c, key, 3)
                       : NULL;
    if (!exp)
        return -2;
    long long end = atoll(exp);
    free(exp);
    long long now = server_ms(c);
    return now >= 0 && end >= now ? end - now : -2;
}

int fx_key_has_data(redisContext *c, const char *key)
{
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    int n = r && r->type == REDIS_REPLY_INTEGER && r->integer > 0;
    if (r)
        freeReplyObject(r);
    return n;
}

/* A protocol 2 field "<...> <until ms>" of key, malloc'd, or NULL when
 * absent or past its until by the server's clock. */
static char *p2_field_live(redisContext *c, const char *key, const char *field)
{
    char *v = reply_str(redisCommand(c, "HGET %s %s", key, field));
    const char *sp = v ? strrchr(v, ' ') : NULL;
    if (v && (!sp || atoll(sp + 1) < server_ms(c))) {
        free(v);
        v = NULL;
    }
    return v;
}

int fx_turn_live(redisContext *c, const char *key)
{
    if (fx_key_protocol(c, key) == 2) {
        char *t = p2_field_live(c, key, "t");
        int live = t != NULL;
        free(t);
        return live;
    }
    char turn[600];
    snprintf(turn, sizeof turn, "%s:turn", key);
    return fx_key_has_data(c, turn);
}

char *fx_record_get(redisContext *c, const char *key, const char *id)
{
    char field[300];
    if (fx_key_protocol(c, key) == 2) {
        snprintf(field, sizeof field, "c:%s", id);
        return p2_field_live(c, key, field);
    }
    return reply_str(redisCommand(c, "GET %s:c:%s", key, id));
}

long long fx_server_lease_ms(const char *key)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        return -2;
    long long v = fx_lease_ms(k, key);
    redisFree(k);
    return v;
}

char *fx_grant_client_name(redisContext *c, const char *key)
{
    int p = fx_key_protocol(c, key);
    if (p == 1)
        return reply_str(redisCommand(c, "HGET %s name", key));
    char *token = p == 2 ? p2_grant_word(c, key, 0) : NULL;
    if (!token)
        return NULL;
    free(token);
    return reply_str(redisCommand(c, "HGET %s n", key));
}

long long fx_grant_since_ms(redisContext *c, const char *key)
{
    int p = fx_key_protocol(c, key);
    if (p == 1) {
        char *since = reply_str(redisCommand(c, "HGET %s since", key));
        long long v = since ? atoll(since) : -1;
        free(since);
        return v;
    }
    /* protocol 2: g's exp less its dur */
    char *exp = p == 2 ? p2_grant_word(c, key, 3) : NULL;
    char *dur = exp ? p2_grant_word(c, key, 4) : NULL;
    long long v = exp && dur ? atoll(exp) - atoll(dur) : -1;
    free(exp);
    free(dur);
    return v;
}
