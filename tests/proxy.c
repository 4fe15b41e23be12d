/*
 * The fault-injecting TCP proxy (see proxy.h).
 *
 * One thread runs one ppoll() loop over: a self-pipe that control calls
 * write to, the listening socket, and both sockets of every connection
 * pair. Sockets are non-blocking. Each pair has two FIFO queues of chunks,
 * up (client -> server) and down (server -> client); a chunk carries the
 * time it may be written (read time + the direction's delay), so a delay
 * costs no sleep: ppoll's timeout is the earliest due time not reached yet
 * (ppoll takes a timespec, so 200 us delays are not rounded to 1 ms).
 *
 * Shared state: p->mu guards the control fields (delays, stall, stop, the
 * hold, cut and reset requests and their results, the counters). Control
 * calls change them under p->mu and write a byte to the self-pipe; the
 * thread copies them under p->mu at the top of each turn and reports
 * results under p->mu. Everything else (pairs, queues, sockets) belongs to
 * the thread alone. p->mu is a leaf lock, never held across I/O; p->cv
 * (CLOCK_MONOTONIC) is broadcast when a result changes, for the waits.
 *
 * Pair life: a pair closes when its client closed and everything the
 * client sent was written upstream (unless held), or when the server closed
 * and everything it sent was written to the client; a held pair whose
 * client closed keeps its upstream side until the held data was released,
 * written, and 200 ms passed (the answers are read and dropped).
 */
#define _GNU_SOURCE
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_MAX 65536
#define LINGER_NS 200000000LL /* a released held pair's upstream, after its last write */
#define PAT_MAX 128

typedef struct chunk {
    struct chunk *next;
    int64_t due; /* CLOCK_MONOTONIC ns */
    size_t len, off;
    char data[];
} chunk;

typedef struct queue {
    chunk *head, *tail;
} queue;

typedef struct pair {
    struct pair *next;
    int cfd, ufd;      /* -1 once closed */
    int c_eof, u_eof;  /* that side will send nothing more */
    queue up, down;
    int held;          /* up chunks are not forwarded: the hold matched here */
    int releasing;     /* released: report when up is empty */
    int cut_pending;   /* drop the next answer and reset the client */
    int64_t linger_until; /* close the upstream side then (0: not set) */
} pair;

struct fx_proxy {
    pthread_t thread;
    int lfd, wake[2];
    int port, upstream_port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Guarded by mu. */
    long up_us, down_us;
    int stall, stop;
    char hold_pat[PAT_MAX];
    int hold_armed, held, release_req, released;
    char cut_pat[PAT_MAX];
    int cut_armed, cut_done;
    int reset_req, reset_result;
    long accepted;
    /* The thread's own. */
    pair *pairs;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void poke(fx_proxy *p)
{
    char b = 1;
    ssize_t w = write(p->wake[1], &b, 1); /* a full pipe already wakes the thread */
    (void)w;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Closes fd so that the peer sees a reset. */
static void rst_close(int fd)
{
    if (fd < 0)
        return;
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static void queue_free(queue *q)
{
    while (q->head) {
        chunk *c = q->head;
        q->head = c->next;
        free(c);
    }
    q->tail = NULL;
}

static void queue_push(queue *q, chunk *c)
{
    c->next = NULL;
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
}

static void pair_free(pair *x, int reset)
{
    if (reset) {
        rst_close(x->cfd);
        rst_close(x->ufd);
    } else {
        if (x->cfd >= 0)
            close(x->cfd);
        if (x->ufd >= 0)
            close(x->ufd);
    }
    queue_free(&x->up);
    queue_free(&x->down);
    free(x);
}

/* Writes the due chunks at q's head to fd. 0, or -1 if fd failed. */
static int flush_queue(queue *q, int fd, int64_t now)
{
    while (q->head && q->head->due <= now) {
        chunk *c = q->head;
        ssize_t n = send(fd, c->data + c->off, c->len - c->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            return -1;
        }
        c->off += (size_t)n;
        if (c->off < c->len)
            return 0;
        q->head = c->next;
        if (!q->head)
            q->tail = NULL;
        free(c);
    }
    return 0;
}

/* Reads one chunk from fd: the chunk, or NULL with *eof set on EOF or an
 * error (or nothing to read: *eof 0). */
static chunk *read_chunk(int fd, int64_t due, int *eof)
{
    static __thread char buf[CHUNK_MAX];
    *eof = 0;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        *eof = 1;
        return NULL;
    }
    if (n < 0)
        return NULL;
    chunk *c = malloc(sizeof *c + (size_t)n);
    if (!c) {
        *eof = 1;
        return NULL;
    }
    c->next = NULL;
    c->due = due;
    c->len = (size_t)n;
    c->off = 0;
    memcpy(c->data, buf, (size_t)n);
    return c;
}

/* A new client: connect it to the upstream. */
static void accept_one(fx_proxy *p)
{
    int cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0)
        return;
    int ufd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)p->upstream_port);
    pair *x = calloc(1, sizeof *x);
    /* A blocking connect on loopback: immediate, accepted or refused. */
    if (ufd < 0 || !x || connect(ufd, (struct sockaddr *)&a, sizeof a) != 0 ||
        set_nonblock(cfd) != 0 || set_nonblock(ufd) != 0) {
        rst_close(cfd);
        if (ufd >= 0)
            close(ufd);
        free(x);
        return;
    }
    nodelay(cfd);
    nodelay(ufd);
    x->cfd = cfd;
    x->ufd = ufd;
    x->next = p->pairs;
    p->pairs = x;
    pthread_mutex_lock(&p->mu);
    p->accepted++;
    pthread_mutex_unlock(&p->mu);
}

/* A snapshot of the control fields, taken under mu. */
typedef struct control {
    long up_us, down_us;
    int stall, stop, hold_armed, release_req, cut_armed, reset_req;
    char hold_pat[PAT_MAX], cut_pat[PAT_MAX];
} control;

/* Copies the control fields; take_release: also takes a pending release
 * request (k->release_req; 0 otherwise). */
static void snapshot(fx_proxy *p, control *k, int take_release)
{
    pthread_mutex_lock(&p->mu);
    k->up_us = p->up_us;
    k->down_us = p->down_us;
    k->stall = p->stall;
    k->stop = p->stop;
    k->hold_armed = p->hold_armed;
    k->release_req = take_release && p->release_req;
    k->cut_armed = p->cut_armed;
    k->reset_req = p->reset_req;
    memcpy(k->hold_pat, p->hold_pat, PAT_MAX);
    memcpy(k->cut_pat, p->cut_pat, PAT_MAX);
    if (take_release)
        p->release_req = 0;
    pthread_mutex_unlock(&p->mu);
}

static void report(fx_proxy *p, int *field, int v)
{
    pthread_mutex_lock(&p->mu);
    *field = v;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* One pair's turn after ppoll. Returns 0 to keep it, 1 to close it. */
static int serve(fx_proxy *p, pair *x, control *k, short crev, short urev, int64_t now)
{
    int eof;
    if (!k->stall && x->cfd >= 0 && !x->c_eof && (crev & (POLLIN | POLLHUP | POLLERR))) {
        chunk *c = read_chunk(x->cfd, now + k->up_us * 1000, &eof);
        if (eof)
            x->c_eof = 1;
        if (c) {
            size_t hl = strlen(k->hold_pat), cl = strlen(k->cut_pat);
            if (k->hold_armed && !x->held && hl && memmem(c->data, c->len, k->hold_pat, hl)) {
                x->held = 1;
                k->hold_armed = 0;
                pthread_mutex_lock(&p->mu);
                p->hold_armed = 0;
                p->held = 1;
                p->released = 0;
                pthread_cond_broadcast(&p->cv);
                pthread_mutex_unlock(&p->mu);
            } else if (k->cut_armed && cl && memmem(c->data, c->len, k->cut_pat, cl)) {
                x->cut_pending = 1;
                k->cut_armed = 0;
                pthread_mutex_lock(&p->mu);
                p->cut_armed = 0;
                pthread_mutex_unlock(&p->mu);
            }
            queue_push(&x->up, c);
        }
        if (x->c_eof && x->cfd >= 0) {
            close(x->cfd); /* the client is gone: nothing more goes back to it */
            x->cfd = -1;
            queue_free(&x->down);
        }
    }
    if (!k->stall && x->ufd >= 0 && !x->u_eof && (urev & (POLLIN | POLLHUP | POLLERR))) {
        chunk *c = read_chunk(x->ufd, now + k->down_us * 1000, &eof);
        if (eof)
            x->u_eof = 1;
        if (c && x->cut_pending) {
            free(c);
            report(p, &p->cut_done, 1); /* before the client can see the reset */
            rst_close(x->cfd);
            x->cfd = -1;
            return 1;
        }
        if (c && x->cfd >= 0)
            queue_push(&x->down, c);
        else
            free(c); /* the client is gone: answers are dropped */
    }
    if (k->stall)
        return 0;
    if (x->ufd >= 0 && !x->held && flush_queue(&x->up, x->ufd, now) != 0)
        return 1;
    if (x->cfd >= 0 && flush_queue(&x->down, x->cfd, now) != 0)
        x->c_eof = 1;
    if (x->releasing && !x->up.head) {
        x->releasing = 0;
        report(p, &p->released, 1);
        if (x->cfd < 0)
            x->linger_until = now + LINGER_NS;
    }
    if (x->linger_until && now >= x->linger_until)
        return 1;
    if (x->cfd < 0 && !x->held && !x->up.head && !x->linger_until)
        return 1; /* the client closed and all it sent went upstream */
    if (x->u_eof && !x->down.head)
        return 1; /* the server closed and all it sent went to the client */
    return 0;
}

static void *proxy_main(void *arg)
{
    fx_proxy *p = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;
    for (;;) {
        control k;
        snapshot(p, &k, 1);
        if (k.stop)
            break;
        if (k.reset_req) {
            int n = 0;
            while (p->pairs) {
                pair *x = p->pairs;
                p->pairs = x->next;
                pair_free(x, 1);
                n++;
            }
            pthread_mutex_lock(&p->mu);
            p->reset_req = 0;
            p->reset_result = n;
            p->held = 0;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        int64_t now = now_ns();
        if (k.release_req) {
            int any = 0;
            for (pair *x = p->pairs; x; x = x->next)
                if (x->held) {
                    x->held = 0;
                    x->releasing = 1;
                    any = 1;
                    for (chunk *c = x->up.head; c; c = c->next)
                        if (c->due > now)
                            c->due = now;
                }
            pthread_mutex_lock(&p->mu);
            p->held = 0;
            if (!any)
                p->released = 1; /* nothing was held (its pair is gone) */
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
        }

        size_t n = 0;
        for (pair *x = p->pairs; x; x = x->next)
            n++;
        if (2 * n + 2 > cap) {
            cap = 2 * n + 16;
            struct pollfd *np = realloc(pfd, cap * sizeof *pfd);
            if (!np)
                break;
            pfd = np;
        }
        pfd[0] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = k.stall ? -1 : p->lfd, .events = POLLIN};
        int64_t next_due = INT64_MAX;
        size_t i = 2;
        for (pair *x = p->pairs; x; x = x->next, i += 2) {
            short ce = 0, ue = 0;
            if (!k.stall) {
                if (x->cfd >= 0 && !x->c_eof)
                    ce |= POLLIN;
                if (x->ufd >= 0 && !x->u_eof)
                    ue |= POLLIN;
                if (x->up.head && !x->held && x->ufd >= 0) {
                    if (x->up.head->due <= now)
                        ue |= POLLOUT;
                    else if (x->up.head->due < next_due)
                        next_due = x->up.head->due;
                }
                if (x->down.head && x->cfd >= 0) {
                    if (x->down.head->due <= now)
                        ce |= POLLOUT;
                    else if (x->down.head->due < next_due)
                        next_due = x->down.head->due;
                }
                if (x->linger_until && x->linger_until < next_due)
                    next_due = x->linger_until;
            }
            pfd[i] = (struct pollfd){.fd = ce ? x->cfd : -1, .events = ce};
            pfd[i + 1] = (struct pollfd){.fd = ue ? x->ufd : -1, .events = ue};
        }
        struct timespec ts, *tsp = NULL;
        if (next_due != INT64_MAX) {
            int64_t d = next_due - now;
            if (d < 0)
                d = 0;
            ts.tv_sec = d / 1000000000LL;
            ts.tv_nsec = d % 1000000000LL;
            tsp = &ts;
        }
        if (ppoll(pfd, 2 + 2 * n, tsp, NULL) < 0 && errno != EINTR)
            break;
        if (pfd[0].revents & POLLIN) {
            char b[64];
            while (read(p->wake[0], b, sizeof b) > 0)
                ;
        }
        /* Control calls made while ppoll waited apply to what it returned:
         * a delay, hold or cut set before a request was sent applies to
         * that request. Stall and stop are taken up again here too; a
         * release or reset waits for the next turn. */
        control k2;
        snapshot(p, &k2, 0);
        if (k2.stop)
            break;
        k = k2;
        now = now_ns();
        i = 2;
        pair **link = &p->pairs;
        while (*link) {
            pair *x = *link;
            if (serve(p, x, &k, pfd[i].revents, pfd[i + 1].revents, now)) {
                *link = x->next;
                pair_free(x, 0);
            } else {
                link = &x->next;
            }
            i += 2;
        }
        if (!k.stall && (pfd[1].revents & POLLIN))
            accept_one(p);
    }
    while (p->pairs) {
        pair *x = p->pairs;
        p->pairs = x->next;
        pair_free(x, 0);
    }
    free(pfd);
    return NULL;
}

fx_proxy *fx_proxy_start(int upstream_port)
{
    fx_proxy *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->upstream_port = upstream_port;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->lfd, 128) != 0 || getsockname(p->lfd, (struct sockaddr *)&a, &len) != 0 ||
        set_nonblock(p->lfd) != 0 || pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "proxy: cannot listen on 127.0.0.1: %s\n", strerror(errno));
        if (p->lfd >= 0)
            close(p->lfd);
        free(p);
        return NULL;
    }
    p->port = ntohs(a.sin_port);
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&p->thread, NULL, proxy_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        fprintf(stderr, "proxy: pthread_create: %s\n", strerror(e));
        close(p->lfd);
        close(p->wake[0]);
        close(p->wake[1]);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    return p;
}

int fx_proxy_port(const fx_proxy *p)
{
    return p->port;
}

void fx_proxy_stop(fx_proxy *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    poke(p);
    pthread_join(p->thread, NULL);
    close(p->lfd);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void fx_proxy_set_delay(fx_proxy *p, long up_us, long down_us)
{
    pthread_mutex_lock(&p->mu);
    p->up_us = up_us > 0 ? up_us : 0;
    p->down_us = down_us > 0 ? down_us : 0;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

void fx_proxy_stall(fx_proxy *p, int on)
{
    pthread_mutex_lock(&p->mu);
    p->stall = on != 0;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

/* Waits under mu (held) until *field == want or ms passed: 0 or -1. */
static int wait_field(fx_proxy *p, const int *field, int want, long ms)
{
    int64_t deadline = now_ns() + (int64_t)ms * 1000000LL;
    struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
    while (*field != want)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) != 0 && *field != want)
            return -1;
    return 0;
}

int fx_proxy_reset_all(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    p->reset_req = 1;
    p->reset_result = -1;
    pthread_mutex_unlock(&p->mu);
    poke(p);
    pthread_mutex_lock(&p->mu);
    while (p->reset_req)
        pthread_cond_wait(&p->cv, &p->mu);
    int n = p->reset_result;
    pthread_mutex_unlock(&p->mu);
    return n;
}

static void set_pattern(char *dst, const char *pattern)
{
    snprintf(dst, PAT_MAX, "%s", pattern ? pattern : "");
}

void fx_proxy_hold_next(fx_proxy *p, const char *pattern)
{
    pthread_mutex_lock(&p->mu);
    set_pattern(p->hold_pat, pattern);
    p->hold_armed = 1;
    p->held = 0;
    p->released = 0;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

int fx_proxy_held(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int v = p->held;
    pthread_mutex_unlock(&p->mu);
    return v;
}

int fx_proxy_wait_held(fx_proxy *p, long ms)
{
    pthread_mutex_lock(&p->mu);
    int rc = wait_field(p, &p->held, 1, ms);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fx_proxy_release_held(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    p->release_req = 1;
    p->released = 0;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

int fx_proxy_wait_released(fx_proxy *p, long ms)
{
    pthread_mutex_lock(&p->mu);
    int rc = wait_field(p, &p->released, 1, ms);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fx_proxy_cut_next(fx_proxy *p, const char *pattern)
{
    pthread_mutex_lock(&p->mu);
    set_pattern(p->cut_pat, pattern);
    p->cut_armed = 1;
    p->cut_done = 0;
    pthread_mutex_unlock(&p->mu);
    poke(p);
}

int fx_proxy_cut_done(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int v = p->cut_done;
    pthread_mutex_unlock(&p->mu);
    return v;
}

long fx_proxy_accepted(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    long v = p->accepted;
    pthread_mutex_unlock(&p->mu);
    return v;
}
