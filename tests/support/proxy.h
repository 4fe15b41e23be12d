/*
 * A fault-injecting TCP proxy for tests and storms: a background thread of the
 * test process listens on a free port of 127.0.0.1 and forwards every
 * connection it accepts to 127.0.0.1:<upstream port> (a redis-server), and on
 * demand delays, stalls, holds back, cuts or resets that traffic.
 *
 * Data moves in chunks: a chunk is what one read of a socket returned (at most
 * 64 KiB). hiredis writes a small command with one write, so on loopback a
 * command normally arrives as one chunk, but pipelined commands can share a
 * chunk and a large one can span several. Pattern matching (hold, cut) looks
 * at each client->server chunk together with the last bytes read before it on
 * that connection, so a pattern split across two reads is found too, in the
 * chunk where it ends; what is held or cut is always whole chunks.
 *
 * Ends of streams pass through in order: an EOF from one side is passed on
 * (shutdown SHUT_WR) once the data queued before it was written, and a pair is
 * closed when both directions ended. An error on either side (a reset) resets
 * both sides and drops what was queued.
 *
 * Every control call (set_delay, stall, reset_all, hold_next, release_held,
 * cut_next) is synchronous: it returns once the proxy thread applied it (a
 * bounded wait of 10 s, with a message on stderr if the thread does not
 * answer). So a hold armed by fx_proxy_hold_next applies to every byte a
 * client sends after the call returned. Control calls may come from any
 * thread; each proxy is stopped by one thread, after every other call ended.
 */
#ifndef DLOCK_PROXY_H
#define DLOCK_PROXY_H

typedef struct fx_proxy fx_proxy;

/* Starts the proxy thread, listening on a free port of 127.0.0.1, forwarding
 * to 127.0.0.1:upstream_port. NULL on failure (message on stderr). The thread
 * blocks all signals (so a test's signal storms never hit it). TCP_NODELAY on
 * both sides of every connection. */
fx_proxy *fx_proxy_start(int upstream_port);

/* The listening port. */
int fx_proxy_port(const fx_proxy *p);

/* Closes every socket (plainly, no reset), joins the thread, frees. NULL ok. */
void fx_proxy_stop(fx_proxy *p);

/* Every chunk read from the client side is written upstream no earlier than
 * up_us after it was read, every chunk from upstream written to the client no
 * earlier than down_us after; order per direction is kept (a chunk never
 * overtakes an earlier one, so after a decrease of the delay a chunk may wait
 * for the slower one ahead of it). An EOF is delayed like a chunk. 0, 0: no
 * delay (the default); negative values count as 0. Applies to chunks read from
 * now on. Sub-millisecond delays are honoured (ppoll with a timespec). */
void fx_proxy_set_delay(fx_proxy *p, long up_us, long down_us);

/* on != 0: nothing is forwarded in either direction and nothing is read (data
 * stays in kernel buffers and proxy queues); connections stay open; new
 * connections are left in the listen backlog (the client's connect succeeds)
 * and not served. on == 0: everything resumes; delay deadlines that passed
 * meanwhile are due at once. Like a frozen network or server that keeps its
 * sockets open. */
void fx_proxy_stall(fx_proxy *p, int on);

/* Resets every open connection on both sides (SO_LINGER {1,0} then close, so
 * the peers see ECONNRESET) and drops queued data; connections still waiting
 * in the listen backlog (a stalled proxy) are accepted and reset too. Returns
 * how many connections were reset (pairs plus backlog ones). Synchronous: done
 * when it returns. A hold on a reset connection ends as dropped (below); an
 * armed hold or cut pattern stays armed. */
int fx_proxy_reset_all(fx_proxy *p);

/*
 * Hold: the next client->server chunk that contains `pattern` (bytes, memmem;
 * short ASCII, at most 127 bytes, longer ones are refused with a message) is
 * not forwarded, nor is anything after it on that connection, until
 * fx_proxy_release_held. Everything else (other connections, replies, data
 * before that chunk) flows normally, and the client side is still read (its
 * data queues behind the held chunk, up to 4 MiB; beyond that the proxy stops
 * reading it, and would notice a close only after the release).
 *
 * If the client closes (or resets) that connection meanwhile, the upstream
 * side of the pair stays open; on release the held data is written upstream
 * (as a stalled network delivering a late request), the upstream's replies
 * are read and discarded, and the pair is closed once the held data is
 * written and upstream has been given 200 ms to answer (or the upstream
 * closes). If the pair ends otherwise before its held data was written
 * (fx_proxy_reset_all, an upstream close or error), the hold ends as dropped.
 *
 * Only one hold at a time: fx_proxy_hold_next while data is held (and not yet
 * fully written after a release) is refused with a message on stderr; while a
 * pattern is armed and nothing matched yet, it replaces the pattern.
 */
void fx_proxy_hold_next(fx_proxy *p, const char *pattern);

/* 1 while a chunk matched and is held (release not yet asked), else 0. */
int fx_proxy_held(fx_proxy *p);

/* 1 once the client of the held connection closed or reset it while its data
 * was held (the upstream side stays open for the release), until the next
 * fx_proxy_hold_next; else 0. */
int fx_proxy_held_orphaned(fx_proxy *p);

/* Waits at most ms until a chunk matched the armed hold pattern (held, or
 * since released or dropped): 0, or -1 on timeout. */
int fx_proxy_wait_held(fx_proxy *p, long ms);

/* The held data (the held chunk and everything queued behind it now) goes
 * upstream now. With a pattern armed and nothing held yet, disarms it.
 * Nothing armed or held: no effect. */
void fx_proxy_release_held(fx_proxy *p);

/* Waits at most ms until the released data was fully written upstream: 0.
 * Also 0 at once when no hold is armed or held. -1 on timeout, or if the hold
 * was dropped (its data never reached upstream). */
int fx_proxy_wait_released(fx_proxy *p, long ms);

/*
 * Cut: the next client->server chunk that contains `pattern` (as for hold)
 * is forwarded; the first reply data that comes back from upstream on that
 * connection after that chunk was written is discarded and the client side of
 * the connection is reset (RST) at once, the upstream side closed, data still
 * queued for the client dropped: a command the server ran whose answer the
 * client never got. A new fx_proxy_cut_next replaces a cut not done yet.
 */
void fx_proxy_cut_next(fx_proxy *p, const char *pattern);

/* 1 once the cut happened (set before the client side is reset, so a client
 * that saw the reset sees 1), until the next fx_proxy_cut_next; else 0. */
int fx_proxy_cut_done(fx_proxy *p);

/* Counters, safe from any thread: connections accepted so far; chunks fully
 * written upstream (client->server) and to clients (server->client), counted
 * when the write returned (so a peer may read a chunk a moment before it is
 * counted); pairs currently open (an orphaned held pair counts until it is
 * closed). */
long fx_proxy_accepted(fx_proxy *p);
long fx_proxy_chunks_up(fx_proxy *p);
long fx_proxy_chunks_down(fx_proxy *p);
int fx_proxy_open(fx_proxy *p);

#endif
