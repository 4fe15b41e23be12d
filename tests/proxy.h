/*
 * A fault-injecting TCP proxy for tests, storms and fault scenarios: a
 * thread of the calling process listens on a free port of 127.0.0.1 and
 * forwards every connection to 127.0.0.1:<upstream port> (a redis-server),
 * injecting on demand: a delay on every chunk (a network round trip), one
 * request held back until told (a late, retransmitted or stalled request),
 * an answer dropped with the connection reset after the server ran the
 * command, a stall of everything, and a reset of every connection.
 *
 * Chunks are what one read() returned. A pattern is matched inside one
 * chunk (memmem); hiredis writes each command, and each pipeline, in one
 * write, so a pattern of one command is found in one chunk on loopback.
 *
 * All functions may be called from any thread but fx_proxy_stop, which must
 * be the last call. The proxy's thread blocks every signal.
 */
#ifndef DLOCK_PROXY_H
#define DLOCK_PROXY_H

typedef struct fx_proxy fx_proxy;

/* Starts the proxy thread, listening on a free port of 127.0.0.1 and
 * forwarding to 127.0.0.1:upstream_port. NULL on failure (message on
 * stderr). */
fx_proxy *fx_proxy_start(int upstream_port);

/* The listening port. */
int fx_proxy_port(const fx_proxy *p);

/* Closes every socket, joins the thread, frees p. NULL is ignored. */
void fx_proxy_stop(fx_proxy *p);

/* Every chunk read from a client is written upstream no earlier than up_us
 * after it was read, every chunk from upstream to its client no earlier than
 * down_us after; order per direction is kept. Applies to chunks read from
 * now on. 0, 0 (the default): no delay. */
void fx_proxy_set_delay(fx_proxy *p, long up_us, long down_us);

/* on != 0: nothing is read or forwarded in either direction and new
 * connections wait in the backlog; every socket stays open (a frozen network
 * or host). on == 0: everything resumes where it stood. */
void fx_proxy_stall(fx_proxy *p, int on);

/* Resets every open connection on both sides (the peers see ECONNRESET) and
 * drops what was queued. Returns the number of connection pairs reset; they
 * are gone when it returns. */
int fx_proxy_reset_all(fx_proxy *p);

/* Hold: the next chunk from a client that contains pattern (at most 127
 * bytes) is not forwarded, nor anything after it on that connection, until
 * fx_proxy_release_held; other connections flow as usual. If the client
 * closes that connection meanwhile, its upstream side stays open: on release
 * the held data is written upstream (a late request), the answers are read
 * and dropped, and the upstream side is closed 200 ms later. One hold at a
 * time. */
void fx_proxy_hold_next(fx_proxy *p, const char *pattern);

/* 1 once a chunk matched and is held (until it is released), else 0. */
int fx_proxy_held(fx_proxy *p);

/* Waits at most ms until a chunk is held: 0, or -1. */
int fx_proxy_wait_held(fx_proxy *p, long ms);

/* Forwards the held data now. */
void fx_proxy_release_held(fx_proxy *p);

/* Waits at most ms until the released data was all written upstream: 0, or
 * -1. */
int fx_proxy_wait_released(fx_proxy *p, long ms);

/* Cut: the next chunk from a client that contains pattern is forwarded;
 * the first answer data that comes back on that connection is dropped and
 * the client's side is reset at once: a command the server ran whose answer
 * the client never got. */
void fx_proxy_cut_next(fx_proxy *p, const char *pattern);

/* 1 once the cut happened, else 0. */
int fx_proxy_cut_done(fx_proxy *p);

/* Connections accepted so far. */
long fx_proxy_accepted(fx_proxy *p);

#endif
