/*
 * A fault-injecting TCP proxy for tests and storms (see proxy.h).
 *
 * Design. One thread runs one ppoll() loop over: the read end of a wake-up
 * pipe, the listening socket, and both non-blocking sockets of every
 * connection pair (client side cfd, upstream side ufd). Each pair has one
 * FIFO queue of chunks per direction (up: client->server, down:
 * server->client); a chunk carries its bytes and the CLOCK_MONOTONIC time it
 * is due (read time + that direction's delay). A chunk of length 0 is an
 * end-of-stream marker: when it is due, the other side gets shutdown(SHUT_WR).
 * Each loop iteration:
 *   1. writes every due head of every queue as far as the socket takes it
 *      (no sleeping per chunk; a socket that is full gets POLLOUT);
 *   2. builds the poll set: POLLIN where more may be read (not after an EOF,
 *      and only while that direction's queue is under 4 MiB), POLLOUT where a
 *      due chunk is blocked by a full socket; a socket wanted for nothing is
 *      left out (so a hung-up socket cannot spin the loop);
 *   3. sleeps in ppoll until the earliest not-yet-due head (a timespec, and
 *      a timer slack of 1 us, so 200 us delays are not rounded up)
 *      or an event; reads at most 64 KiB per readable event and writes it on
 *      at once when it is due at once.
 * A stalled proxy polls only the wake-up pipe, and writes nothing.
 *
 * Faults. Client chunks are matched against the armed hold and cut patterns
 * when read (with the pair's last 127 client bytes, for patterns split over
 * two reads). A hold sets pair->hold_at to the matched chunk; release marks
 * the chunk then at the tail of the up queue and clears hold_at; writing that
 * chunk completes the release. A client that goes away from a held pair
 * turns it into an orphan: client side closed, replies discarded, closed 200
 * ms after the release was written. A cut marks its chunk; once it was
 * written, the pair's next upstream data is dropped and the client reset.
 *
 * Every wait is bounded: the thread's ppoll wakes at least once a second (and
 * at once on a control call), control calls wait at most 10 s for the ack,
 * and the tests' waits take a bound in ms.
 *
 * Control. Callers (test threads) change the shared fields under `mu`, bump
 * ctl_seq, write a byte into the pipe and wait (bounded) on `cv` until the
 * thread acknowledged that sequence number. When the pipe is readable the
 * thread applies the control state first, acknowledges, and skips the socket
 * events of that poll round (poll is level-triggered: they come back), so no
 * byte read after a control call returned is handled under the old state, and
 * no pair is freed under the loop's feet. The thread publishes what the tests
 * wait for (hold and cut progress) under `mu` and broadcasts `cv`.
 *
 * Invariants.
 *   - Only the thread touches pairs, queues, sockets and the t_* fields.
 *   - The fields under `mu` are read and written under `mu` only; counters are
 *     C11 atomics. `port`, `upstream_port` and the fds of the listener and the
 *     pipe are set before the thread starts and never change until it is
 *     joined.
 *   - A chunk leaves its queue only fully written or dropped with its pair;
 *     the up queue is never written past pair->hold_at.
 *   - t_hold_pair is the pair whose data is held (state HELD or RELEASING),
 *     NULL otherwise; t_cut_pair is the pair whose cut chunk matched and
 *     whose cut has not happened. Both are cleared when that pair dies.
 *   - A pair marked dead has both sockets closed and its queues freed; it is
 *     unlinked and freed only between poll rounds (sweep), since the poll
 *     set still points at it.
 *
 * Lock order: `mu` is the only lock, a leaf: no I/O under it except the
 * non-blocking one-byte write into the wake-up pipe, and no other lock taken
 * while it is held.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PX_READ_MAX (64 * 1024)          /* per readable event */
#define PX_QUEUE_CAP (4 * 1024 * 1024)   /* per direction: stop reading above */
#define PX_PAT_MAX 127                    /* proxy.h: patterns of at most 127 bytes */
#define PX_ORPHAN_GRACE_NS (200 * 1000000LL) /* proxy.h: upstream has 200 ms to answer */
#define PX_ACK_WAIT_MS 10000              /* proxy.h: control calls wait at most 10 s */
#define PX_POLL_MAX_NS 1000000000LL       /* the loop wakes at least once a second */
#define PX_ACCEPT_BATCH 64                /* accepts per readable listener event */
#define PX_BACKLOG 512

typedef struct px_chunk {
    struct px_chunk *next;
    long long due;          /* CLOCK_MONOTONIC ns: not written before */
    size_t len, off;        /* len 0: end-of-stream marker; off: bytes written */
    int release_mark;       /* last chunk of released held data */
    unsigned long cut_gen;  /* != 0: matched the cut pattern of that generation */
    unsigned char data[];
} px_chunk;

typedef struct px_queue {
    px_chunk *head, *tail;
    size_t bytes;           /* data bytes queued (not yet written) */
} px_queue;

typedef struct px_pair {
    struct px_pair *next;
    int cfd, ufd;               /* client side, upstream side; -1 once closed */
    int connecting;             /* upstream connect() in progress */
    int c_eof, u_eof;           /* EOF read from the client / from upstream */
    int up_done, down_done;     /* that EOF was passed on (shutdown SHUT_WR) */
    int orphan;                 /* client gone while its data was held */
    long long orphan_deadline;  /* 0, or when the orphan is closed */
    int cut_wait;               /* cut chunk written: next upstream data cuts */
    int dead;
    px_queue up, down;
    px_chunk *hold_at;          /* the up queue is not written from here on */
    size_t tail_len;
    unsigned char tail[PX_PAT_MAX]; /* last bytes read from the client */
} px_pair;

enum { H_IDLE, H_ARMED, H_HELD, H_RELEASING, H_RELEASED, H_DROPPED };
enum { C_IDLE, C_ARMED, C_MATCHED, C_DONE };
enum { UP, DOWN };

struct fx_proxy {
    int upstream_port, port;
    int lfd;                    /* listening socket */
    int wake[2];                /* wake-up pipe: [0] polled by the thread */
    pthread_t thread;

    /* Shared with the callers, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* acks, hold and cut progress */
    unsigned long ctl_seq, ack_seq;
    int stop, stall;
    long long up_ns, down_ns;
    int hold_state;             /* H_* */
    int hold_orphaned;          /* the held pair's client went away */
    unsigned long hold_gen;     /* bumped by each fx_proxy_hold_next */
    char hold_pat[PX_PAT_MAX + 1];
    size_t hold_len;
    int cut_state;              /* C_* */
    unsigned long cut_gen;
    char cut_pat[PX_PAT_MAX + 1];
    size_t cut_len;
    unsigned long reset_req, reset_ack;
    int reset_count;

    atomic_long accepted, chunks_up, chunks_down;
    atomic_int open_pairs;

    /* The thread's own. */
    px_pair *pairs;
    int t_stall;
    long long t_up_ns, t_down_ns;
    int t_hold_armed;
    unsigned long t_hold_gen;
    unsigned char t_hold_pat[PX_PAT_MAX];
    size_t t_hold_len;
    px_pair *t_hold_pair;
    int t_cut_armed;
    unsigned long t_cut_gen;
    unsigned char t_cut_pat[PX_PAT_MAX];
    size_t t_cut_len;
    px_pair *t_cut_pair;
    unsigned long t_reset_req;
    struct pollfd *pfd;         /* the poll set, and the pair of each entry */
    px_pair **owner;
    size_t pcap;
    unsigned char *buf;         /* PX_READ_MAX bytes */
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Close with SO_LINGER {1,0}: the peer gets RST (ECONNRESET). */
static void close_rst(int fd)
{
    if (fd < 0)
        return;
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

/* ---- queues ---------------------------------------------------------- */

static px_chunk *chunk_new(const unsigned char *data, size_t len, long long due)
{
    px_chunk *c = malloc(sizeof *c + len);
    if (!c)
        return NULL;
    c->next = NULL;
    c->due = due;
    c->len = len;
    c->off = 0;
    c->release_mark = 0;
    c->cut_gen = 0;
    if (len)
        memcpy(c->data, data, len);
    return c;
}

static void q_push(px_queue *q, px_chunk *c)
{
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    q->bytes += c->len;
}

static px_chunk *q_pop(px_queue *q)
{
    px_chunk *c = q->head;
    q->head = c->next;
    if (!q->head)
        q->tail = NULL;
    q->bytes -= c->len;
    return c;
}

static void q_clear(px_queue *q)
{
    while (q->head)
        free(q_pop(q));
}

/* ---- shared state published by the thread ----------------------------- */

static void publish_hold(fx_proxy *p, int from_a, int from_b, int to)
{
    pthread_mutex_lock(&p->mu);
    if (p->hold_state == from_a || p->hold_state == from_b) {
        p->hold_state = to;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

/* ---- pairs ------------------------------------------------------------ */

/* Ends a pair: closes both sides (reset or plain), drops its queues, ends a
 * hold or cut on it. The struct is freed by sweep(). */
static void pair_kill(fx_proxy *p, px_pair *pr, int rst_client, int rst_upstream)
{
    if (pr->dead)
        return;
    if (rst_client)
        close_rst(pr->cfd);
    else if (pr->cfd >= 0)
        close(pr->cfd);
    if (rst_upstream)
        close_rst(pr->ufd);
    else if (pr->ufd >= 0)
        close(pr->ufd);
    pr->cfd = pr->ufd = -1;
    q_clear(&pr->up);
    q_clear(&pr->down);
    pr->hold_at = NULL;
    pr->dead = 1;
    atomic_fetch_sub(&p->open_pairs, 1);
    if (p->t_hold_pair == pr) {
        p->t_hold_pair = NULL;
        publish_hold(p, H_HELD, H_RELEASING, H_DROPPED);
    }
    if (p->t_cut_pair == pr)
        p->t_cut_pair = NULL;
}

static void sweep(fx_proxy *p)
{
    px_pair **link = &p->pairs;
    while (*link) {
        px_pair *pr = *link;
        if (pr->dead) {
            *link = pr->next;
            free(pr);
        } else {
            link = &pr->next;
        }
    }
}

/* The client of the held pair went away: keep the upstream side for the
 * held data (proxy.h). */
static void orphan(fx_proxy *p, px_pair *pr)
{
    if (pr->u_eof) { /* nobody left to deliver to */
        pair_kill(p, pr, 0, 0);
        return;
    }
    if (pr->cfd >= 0)
        close(pr->cfd);
    pr->cfd = -1;
    pr->c_eof = 1;
    q_clear(&pr->down);
    pr->orphan = 1;
    pthread_mutex_lock(&p->mu);
    p->hold_orphaned = 1;
    pthread_mutex_unlock(&p->mu);
}

/* The last chunk of released held data was written. */
static void released(fx_proxy *p, px_pair *pr)
{
    if (p->t_hold_pair == pr)
        p->t_hold_pair = NULL;
    publish_hold(p, H_RELEASING, H_RELEASING, H_RELEASED);
    if (pr->orphan)
        pr->orphan_deadline = now_ns() + PX_ORPHAN_GRACE_NS;
}

/* Writes the due head chunks of one direction as far as the socket takes
 * them. */
static void flush(fx_proxy *p, px_pair *pr, int dir, long long now)
{
    px_queue *q = dir == UP ? &pr->up : &pr->down;
    int fd = dir == UP ? pr->ufd : pr->cfd;
    if (p->t_stall || pr->dead || fd < 0 || (dir == UP && pr->connecting))
        return;
    px_chunk *c;
    while ((c = q->head) != NULL) {
        if (dir == UP && c == pr->hold_at)
            return;
        if (c->due > now)
            return;
        if (c->len == 0) { /* end of stream */
            shutdown(fd, SHUT_WR);
            free(q_pop(q));
            if (dir == UP)
                pr->up_done = 1;
            else
                pr->down_done = 1;
            if (pr->up_done && pr->down_done)
                pair_kill(p, pr, 0, 0);
            return;
        }
        ssize_t w = send(fd, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pair_kill(p, pr, 1, 1);
            return;
        }
        c->off += (size_t)w;
        if (c->off < c->len)
            return; /* the socket is full: POLLOUT */
        c = q_pop(q);
        atomic_fetch_add(dir == UP ? &p->chunks_up : &p->chunks_down, 1);
        if (c->cut_gen && c->cut_gen == p->t_cut_gen && p->t_cut_pair == pr)
            pr->cut_wait = 1;
        int rel = c->release_mark;
        free(c);
        if (rel)
            released(p, pr);
    }
}

/* Does pattern occur in data, or across the end of the bytes read before it
 * (pr->tail) and the start of data? */
static int matches(const px_pair *pr, const unsigned char *data, size_t n,
                   const unsigned char *pat, size_t plen)
{
    if (plen == 0 || memmem(data, n, pat, plen))
        return 1;
    if (plen < 2 || pr->tail_len == 0)
        return 0;
    /* At most plen-1 bytes from each side: a match must straddle. */
    unsigned char both[2 * PX_PAT_MAX];
    size_t a = pr->tail_len < plen - 1 ? pr->tail_len : plen - 1;
    size_t b = n < plen - 1 ? n : plen - 1;
    memcpy(both, pr->tail + pr->tail_len - a, a);
    memcpy(both + a, data, b);
    return memmem(both, a + b, pat, plen) != NULL;
}

static void remember_tail(px_pair *pr, const unsigned char *data, size_t n)
{
    if (n >= PX_PAT_MAX) {
        memcpy(pr->tail, data + n - PX_PAT_MAX, PX_PAT_MAX);
        pr->tail_len = PX_PAT_MAX;
        return;
    }
    size_t keep = pr->tail_len + n > PX_PAT_MAX ? PX_PAT_MAX - n : pr->tail_len;
    memmove(pr->tail, pr->tail + pr->tail_len - keep, keep);
    memcpy(pr->tail + keep, data, n);
    pr->tail_len = keep + n;
}

/* A chunk from the client: check the hold and cut patterns. */
static void inspect(fx_proxy *p, px_pair *pr, px_chunk *c)
{
    if (p->t_hold_armed && matches(pr, c->data, c->len, p->t_hold_pat, p->t_hold_len)) {
        p->t_hold_armed = 0;
        pthread_mutex_lock(&p->mu);
        /* Still the hold this thread applied (not disarmed or replaced since)? */
        int ok = p->hold_state == H_ARMED && p->hold_gen == p->t_hold_gen;
        if (ok) {
            p->hold_state = H_HELD;
            pr->hold_at = c;
            p->t_hold_pair = pr;
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
    }
    if (p->t_cut_armed && matches(pr, c->data, c->len, p->t_cut_pat, p->t_cut_len)) {
        p->t_cut_armed = 0;
        c->cut_gen = p->t_cut_gen;
        p->t_cut_pair = pr;
        pthread_mutex_lock(&p->mu);
        if (p->cut_state == C_ARMED && p->cut_gen == p->t_cut_gen)
            p->cut_state = C_MATCHED;
        pthread_mutex_unlock(&p->mu);
    }
    remember_tail(pr, c->data, c->len);
}

static void read_client(fx_proxy *p, px_pair *pr)
{
    ssize_t n = recv(pr->cfd, p->buf, PX_READ_MAX, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        if (p->t_hold_pair == pr)
            orphan(p, pr);
        else
            pair_kill(p, pr, 1, 1);
        return;
    }
    long long now = now_ns();
    if (n == 0) {
        pr->c_eof = 1;
        if (p->t_hold_pair == pr) {
            orphan(p, pr);
            return;
        }
    }
    px_chunk *c = chunk_new(p->buf, (size_t)n, now + p->t_up_ns);
    if (!c) {
        fprintf(stderr, "proxy: out of memory, connection reset\n");
        pair_kill(p, pr, 1, 1);
        return;
    }
    if (n > 0)
        inspect(p, pr, c);
    q_push(&pr->up, c);
    flush(p, pr, UP, now);
}

/* The cut: the reply is dropped, the client reset, upstream closed. */
static void cut(fx_proxy *p, px_pair *pr)
{
    p->t_cut_pair = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->cut_gen == p->t_cut_gen)
        p->cut_state = C_DONE; /* before the reset: a client that saw it sees DONE */
    pthread_mutex_unlock(&p->mu);
    pair_kill(p, pr, 1, 0);
}

static void read_upstream(fx_proxy *p, px_pair *pr)
{
    ssize_t n = recv(pr->ufd, p->buf, PX_READ_MAX, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        pair_kill(p, pr, 1, 1);
        return;
    }
    if (pr->orphan) { /* replies to a client that is gone: discarded */
        if (n == 0)
            pair_kill(p, pr, 0, 0);
        return;
    }
    if (n > 0 && pr->cut_wait) {
        cut(p, pr);
        return;
    }
    long long now = now_ns();
    if (n == 0)
        pr->u_eof = 1;
    px_chunk *c = chunk_new(p->buf, (size_t)n, now + p->t_down_ns);
    if (!c) {
        fprintf(stderr, "proxy: out of memory, connection reset\n");
        pair_kill(p, pr, 1, 1);
        return;
    }
    q_push(&pr->down, c);
    flush(p, pr, DOWN, now);
}

/* The upstream connect() finished: check how. */
static void connected(fx_proxy *p, px_pair *pr)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(pr->ufd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err == EINPROGRESS || err == EALREADY)
        return;
    if (err) {
        pair_kill(p, pr, 1, 1);
        return;
    }
    pr->connecting = 0;
    flush(p, pr, UP, now_ns());
}

/* A new pair for client socket cfd; NULL (cfd reset) if upstream cannot be
 * reached. */
static px_pair *pair_new(fx_proxy *p, int cfd)
{
    set_nodelay(cfd);
    int ufd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ufd < 0) {
        close_rst(cfd);
        return NULL;
    }
    set_nodelay(ufd);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((unsigned short)p->upstream_port);
    int connecting = 0;
    if (connect(ufd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (errno != EINPROGRESS) {
            close(ufd);
            close_rst(cfd);
            return NULL;
        }
        connecting = 1;
    }
    px_pair *pr = calloc(1, sizeof *pr);
    if (!pr) {
        close(ufd);
        close_rst(cfd);
        return NULL;
    }
    pr->cfd = cfd;
    pr->ufd = ufd;
    pr->connecting = connecting;
    pr->next = p->pairs;
    p->pairs = pr;
    atomic_fetch_add(&p->open_pairs, 1);
    return pr;
}

static void accept_some(fx_proxy *p)
{
    for (int i = 0; i < PX_ACCEPT_BATCH; i++) {
        int cfd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* Out of fds, say: the listener stays readable; do not spin. */
                fprintf(stderr, "proxy: accept: %s\n", strerror(errno));
                struct timespec pause = {0, 10000000L};
                nanosleep(&pause, NULL);
            }
            return;
        }
        atomic_fetch_add(&p->accepted, 1);
        pair_new(p, cfd);
    }
}

/* fx_proxy_reset_all, in the thread: how many connections were reset. */
static int reset_everything(fx_proxy *p)
{
    int n = 0;
    for (px_pair *pr = p->pairs; pr; pr = pr->next) {
        if (!pr->dead) {
            pair_kill(p, pr, 1, 1);
            n++;
        }
    }
    sweep(p);
    for (;;) { /* the listen backlog (a stalled proxy does not accept) */
        int cfd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break;
        }
        atomic_fetch_add(&p->accepted, 1);
        close_rst(cfd);
        n++;
    }
    return n;
}

/* Takes over what the callers changed, acknowledges. 1 when asked to stop. */
static int apply_control(fx_proxy *p)
{
    char drain[64];
    while (read(p->wake[0], drain, sizeof drain) > 0)
        ;
    pthread_mutex_lock(&p->mu);
    unsigned long seq = p->ctl_seq;
    int stop = p->stop;
    p->t_stall = p->stall;
    p->t_up_ns = p->up_ns;
    p->t_down_ns = p->down_ns;
    p->t_hold_armed = p->hold_state == H_ARMED;
    p->t_hold_gen = p->hold_gen;
    memcpy(p->t_hold_pat, p->hold_pat, p->hold_len);
    p->t_hold_len = p->hold_len;
    int release = p->hold_state == H_RELEASING;
    if (p->cut_gen != p->t_cut_gen) {
        if (p->t_cut_pair)
            p->t_cut_pair->cut_wait = 0;
        p->t_cut_pair = NULL;
        p->t_cut_gen = p->cut_gen;
        p->t_cut_armed = p->cut_state == C_ARMED;
        memcpy(p->t_cut_pat, p->cut_pat, p->cut_len);
        p->t_cut_len = p->cut_len;
    }
    unsigned long reset = p->reset_req;
    pthread_mutex_unlock(&p->mu);

    px_pair *hp = p->t_hold_pair;
    if (release && hp && hp->hold_at) {
        /* Everything queued now is the held data; its last chunk tells when
         * it was all written. */
        hp->up.tail->release_mark = 1;
        hp->hold_at = NULL;
        flush(p, hp, UP, now_ns());
    }
    int reset_now = reset != p->t_reset_req, count = 0;
    if (reset_now) {
        p->t_reset_req = reset;
        count = reset_everything(p);
    }

    pthread_mutex_lock(&p->mu);
    if (reset_now) { /* every reset_all counted in `reset` gets this count */
        p->reset_ack = reset;
        p->reset_count = count;
    }
    p->ack_seq = seq;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return stop;
}

/* Room for n poll entries. 0, or -1 out of memory. */
static int poll_room(fx_proxy *p, size_t n)
{
    if (n <= p->pcap)
        return 0;
    size_t cap = p->pcap ? p->pcap : 64;
    while (cap < n)
        cap *= 2;
    struct pollfd *pfd = realloc(p->pfd, cap * sizeof *pfd);
    if (!pfd)
        return -1;
    p->pfd = pfd;
    px_pair **owner = realloc(p->owner, cap * sizeof *owner);
    if (!owner)
        return -1;
    p->owner = owner;
    p->pcap = cap;
    return 0;
}

/* The earliest future due time of a queue's head, into *next. */
static void note_due(const px_queue *q, const px_chunk *blocked, long long now, long long *next)
{
    const px_chunk *c = q->head;
    if (c && c != blocked && c->due > now && c->due < *next)
        *next = c->due;
}

/* POLLOUT wanted: a due data chunk at the head (flush() left it: socket full). */
static int due_data(const px_queue *q, const px_chunk *blocked, long long now)
{
    const px_chunk *c = q->head;
    return c && c != blocked && c->len > 0 && c->due <= now;
}

static void add_pfd(fx_proxy *p, size_t *n, int fd, short events, px_pair *pr)
{
    p->pfd[*n].fd = events ? fd : -1; /* wanted for nothing: not polled */
    p->pfd[*n].events = events;
    p->pfd[*n].revents = 0;
    p->owner[*n] = pr;
    (*n)++;
}

static void *run(void *arg)
{
    fx_proxy *p = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, NULL);
    /* The default 50 us timer slack would add a quarter to a 200 us delay. */
    prctl(PR_SET_TIMERSLACK, 1000UL);

    for (;;) {
        long long now = now_ns();
        long long next = now + PX_POLL_MAX_NS;
        size_t npairs = 0;
        if (!p->t_stall) {
            for (px_pair *pr = p->pairs; pr; pr = pr->next) {
                flush(p, pr, UP, now);
                flush(p, pr, DOWN, now);
                if (!pr->dead && pr->orphan && pr->orphan_deadline && now >= pr->orphan_deadline)
                    pair_kill(p, pr, 0, 0);
            }
            sweep(p);
            for (px_pair *pr = p->pairs; pr; pr = pr->next)
                npairs++;
        }
        if (poll_room(p, 2 + 2 * npairs) != 0) {
            fprintf(stderr, "proxy: out of memory, connections reset\n");
            reset_everything(p);
            npairs = 0;
            if (poll_room(p, 2) != 0) {
                struct timespec pause = {0, 10000000L}; /* bounded retry */
                nanosleep(&pause, NULL);
                continue;
            }
        }
        size_t n = 0;
        add_pfd(p, &n, p->wake[0], POLLIN, NULL);
        add_pfd(p, &n, p->lfd, p->t_stall ? 0 : POLLIN, NULL);
        if (!p->t_stall) {
            for (px_pair *pr = p->pairs; pr; pr = pr->next) {
                short ce = 0, ue = 0;
                if (pr->cfd >= 0) {
                    if (!pr->c_eof && pr->up.bytes < PX_QUEUE_CAP)
                        ce |= POLLIN;
                    if (due_data(&pr->down, NULL, now))
                        ce |= POLLOUT;
                    note_due(&pr->down, NULL, now, &next);
                }
                if (pr->connecting) {
                    ue = POLLOUT;
                } else if (pr->ufd >= 0) {
                    if (!pr->u_eof && (pr->orphan || pr->down.bytes < PX_QUEUE_CAP))
                        ue |= POLLIN;
                    if (due_data(&pr->up, pr->hold_at, now))
                        ue |= POLLOUT;
                    note_due(&pr->up, pr->hold_at, now, &next);
                }
                if (pr->orphan && pr->orphan_deadline && pr->orphan_deadline < next)
                    next = pr->orphan_deadline;
                add_pfd(p, &n, pr->cfd, ce, pr);
                add_pfd(p, &n, pr->ufd, ue, pr);
            }
        }
        long long wait = next - now_ns(); /* the flushes above took time */
        if (wait < 0)
            wait = 0;
        struct timespec ts = {(time_t)(wait / 1000000000LL), (long)(wait % 1000000000LL)};
        int rc = ppoll(p->pfd, n, &ts, NULL);
        if (rc < 0) {
            if (errno != EINTR) {
                fprintf(stderr, "proxy: ppoll: %s\n", strerror(errno));
                struct timespec pause = {0, 10000000L}; /* do not spin on a persistent error */
                nanosleep(&pause, NULL);
            }
            continue;
        }
        if (p->pfd[0].revents) {
            if (apply_control(p))
                break;
            continue; /* socket events come back at the next poll */
        }
        if (p->t_stall)
            continue;
        if (p->pfd[1].revents)
            accept_some(p);
        for (size_t i = 2; i < n; i++) {
            short re = p->pfd[i].revents;
            px_pair *pr = p->owner[i];
            if (!re || pr->dead)
                continue;
            short ev = p->pfd[i].events;
            int client = (i % 2) == 0; /* entries come in pairs: cfd, ufd */
            if (re & POLLNVAL) {
                pair_kill(p, pr, 1, 1);
                continue;
            }
            if (!client && pr->connecting) {
                connected(p, pr);
                continue;
            }
            if ((ev & POLLIN) && (re & (POLLIN | POLLHUP | POLLERR))) {
                if (client)
                    read_client(p, pr);
                else
                    read_upstream(p, pr);
            }
            if (!pr->dead && (ev & POLLOUT) && (re & (POLLOUT | POLLHUP | POLLERR)))
                flush(p, pr, client ? DOWN : UP, now_ns());
        }
        sweep(p);
    }

    for (px_pair *pr = p->pairs; pr; pr = pr->next)
        pair_kill(p, pr, 0, 0);
    sweep(p);
    return NULL;
}

/* ---- control calls ---------------------------------------------------- */

static void deadline_ts(struct timespec *ts, long long deadline)
{
    ts->tv_sec = (time_t)(deadline / 1000000000LL);
    ts->tv_nsec = (long)(deadline % 1000000000LL);
}

/* With mu held: hands the change to the thread and waits (bounded) until it
 * was applied. */
static void commit(fx_proxy *p, const char *what)
{
    unsigned long seq = ++p->ctl_seq;
    if (write(p->wake[1], "x", 1) < 0 && errno != EAGAIN)
        fprintf(stderr, "proxy: wake-up: %s\n", strerror(errno));
    long long deadline = now_ns() + PX_ACK_WAIT_MS * 1000000LL;
    struct timespec ts;
    deadline_ts(&ts, deadline);
    while (p->ack_seq < seq) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT && p->ack_seq < seq) {
            fprintf(stderr, "proxy: %s not applied within %d ms\n", what, PX_ACK_WAIT_MS);
            return;
        }
    }
}

fx_proxy *fx_proxy_start(int upstream_port)
{
    fx_proxy *p = calloc(1, sizeof *p);
    if (!p) {
        fprintf(stderr, "proxy: out of memory\n");
        return NULL;
    }
    p->upstream_port = upstream_port;
    p->lfd = p->wake[0] = p->wake[1] = -1;
    p->buf = malloc(PX_READ_MAX);
    if (!p->buf) {
        fprintf(stderr, "proxy: out of memory\n");
        free(p);
        return NULL;
    }

    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0; /* bound, not probed: the port cannot be taken meanwhile */
    socklen_t len = sizeof a;
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->lfd, PX_BACKLOG) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "proxy: listen on 127.0.0.1: %s\n", strerror(errno));
        goto fail;
    }
    p->port = ntohs(a.sin_port);
    if (pipe2(p->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        fprintf(stderr, "proxy: pipe: %s\n", strerror(errno));
        goto fail;
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&p->mu, NULL);

    /* The thread inherits a mask that blocks everything. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&p->thread, NULL, run, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        fprintf(stderr, "proxy: pthread_create: %s\n", strerror(rc));
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    return p;

fail:
    if (p->lfd >= 0)
        close(p->lfd);
    if (p->wake[0] >= 0) {
        close(p->wake[0]);
        close(p->wake[1]);
    }
    free(p->buf);
    free(p);
    return NULL;
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
    if (write(p->wake[1], "x", 1) < 0 && errno != EAGAIN)
        fprintf(stderr, "proxy: wake-up: %s\n", strerror(errno));
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    close(p->lfd);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->pfd);
    free(p->owner);
    free(p->buf);
    free(p);
}

void fx_proxy_set_delay(fx_proxy *p, long up_us, long down_us)
{
    pthread_mutex_lock(&p->mu);
    p->up_ns = up_us > 0 ? (long long)up_us * 1000LL : 0;
    p->down_ns = down_us > 0 ? (long long)down_us * 1000LL : 0;
    commit(p, "set_delay");
    pthread_mutex_unlock(&p->mu);
}

void fx_proxy_stall(fx_proxy *p, int on)
{
    pthread_mutex_lock(&p->mu);
    p->stall = on != 0;
    commit(p, "stall");
    pthread_mutex_unlock(&p->mu);
}

int fx_proxy_reset_all(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    unsigned long req = ++p->reset_req;
    commit(p, "reset_all");
    int n = p->reset_ack >= req ? p->reset_count : -1;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* Copies pattern into pat/len; -1 (message) if it is empty or too long. */
static int set_pattern(char *pat, size_t *len, const char *pattern, const char *what)
{
    size_t n = pattern ? strlen(pattern) : 0;
    if (n == 0 || n > PX_PAT_MAX) {
        fprintf(stderr, "proxy: %s: pattern must have 1 to %d bytes\n", what, PX_PAT_MAX);
        return -1;
    }
    memcpy(pat, pattern, n + 1);
    *len = n;
    return 0;
}

void fx_proxy_hold_next(fx_proxy *p, const char *pattern)
{
    pthread_mutex_lock(&p->mu);
    if (p->hold_state == H_HELD || p->hold_state == H_RELEASING) {
        fprintf(stderr, "proxy: hold_next: a hold is still in progress\n");
    } else if (set_pattern(p->hold_pat, &p->hold_len, pattern, "hold_next") == 0) {
        p->hold_gen++;
        p->hold_state = H_ARMED;
        p->hold_orphaned = 0;
        commit(p, "hold_next");
    }
    pthread_mutex_unlock(&p->mu);
}

int fx_proxy_held(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int held = p->hold_state == H_HELD;
    pthread_mutex_unlock(&p->mu);
    return held;
}

int fx_proxy_held_orphaned(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int gone = p->hold_orphaned;
    pthread_mutex_unlock(&p->mu);
    return gone;
}

/* With mu held: waits until done(p) or ms passed. 0 or -1. */
static int wait_for(fx_proxy *p, long ms, int (*done)(const fx_proxy *))
{
    long long deadline = now_ns() + (ms > 0 ? ms : 0) * 1000000LL;
    struct timespec ts;
    deadline_ts(&ts, deadline);
    while (!done(p)) {
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT)
            return done(p) ? 0 : -1;
    }
    return 0;
}

static int matched(const fx_proxy *p)
{
    return p->hold_state == H_HELD || p->hold_state == H_RELEASING ||
           p->hold_state == H_RELEASED || p->hold_state == H_DROPPED;
}

static int written_or_dropped(const fx_proxy *p)
{
    return p->hold_state == H_RELEASED || p->hold_state == H_IDLE ||
           p->hold_state == H_DROPPED;
}

int fx_proxy_wait_held(fx_proxy *p, long ms)
{
    pthread_mutex_lock(&p->mu);
    int rc = wait_for(p, ms, matched);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fx_proxy_release_held(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    if (p->hold_state == H_ARMED) {
        p->hold_state = H_IDLE;
        commit(p, "release_held");
    } else if (p->hold_state == H_HELD) {
        p->hold_state = H_RELEASING;
        commit(p, "release_held");
    }
    pthread_mutex_unlock(&p->mu);
}

int fx_proxy_wait_released(fx_proxy *p, long ms)
{
    pthread_mutex_lock(&p->mu);
    int rc = wait_for(p, ms, written_or_dropped);
    if (p->hold_state == H_DROPPED)
        rc = -1;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fx_proxy_cut_next(fx_proxy *p, const char *pattern)
{
    pthread_mutex_lock(&p->mu);
    if (set_pattern(p->cut_pat, &p->cut_len, pattern, "cut_next") == 0) {
        p->cut_gen++;
        p->cut_state = C_ARMED;
        commit(p, "cut_next");
    }
    pthread_mutex_unlock(&p->mu);
}

int fx_proxy_cut_done(fx_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int done = p->cut_state == C_DONE;
    pthread_mutex_unlock(&p->mu);
    return done;
}

long fx_proxy_accepted(fx_proxy *p)
{
    return atomic_load(&p->accepted);
}

long fx_proxy_chunks_up(fx_proxy *p)
{
    return atomic_load(&p->chunks_up);
}

long fx_proxy_chunks_down(fx_proxy *p)
{
    return atomic_load(&p->chunks_down);
}

int fx_proxy_open(fx_proxy *p)
{
    return atomic_load(&p->open_pairs);
}
