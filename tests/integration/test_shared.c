/*
 * The shared (read) mode against a real redis-server (dlock.h,
 * dlock_acquire_shared; src/local/shared.h, S1 to S7): shared holders of
 * several clients at once and never beside an exclusive one; joins that
 * cost no Redis command; writers first, locally and across clients; the
 * join window; invitations and direct shared grants; reentrancy, nesting
 * and the refused upgrade; tokens; lost leases, thread exits, close,
 * cancel and shutdown. Faults across the two modes: test_shared_faults.c;
 * the helpers: tests/support/shared_helpers.h.
 */
#include "shared_helpers.h"

/* Several clients hold a name shared at once; an exclusive acquire waits
 * for all of them; tokens: each shared grant above every token before it,
 * every exclusive token after it above it. */
static void test_readers_share_writer_waits(void **state)
{
    (void)state;
    dlock_client *a = open_client(20), *b = open_client(20), *w = open_client(20);
    uint64_t fx0, fa, fb, fx1;
    assert_int_equal(dlock_acquire(w, "rw", 0, &fx0), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(a, "rw", 0, NULL), DLOCK_EBUSY); /* beside a writer */
    assert_int_equal(dlock_release(w, "rw"), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(a, "rw", 0, &fa), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(b, "rw", 0, &fb), DLOCK_OK);
    assert_true(fa > fx0);
    assert_true(fb > fx0);
    assert_int_equal(shared_fields("rw"), 2);
    assert_int_equal(dlock_held(a, "rw"), 1);
    assert_int_equal(dlock_acquire(w, "rw", 0, NULL), DLOCK_EBUSY);
    taker t;
    taker_start(&t, w, "rw", 0, 10000);
    let_it_wait();
    assert_false(taker_done(&t));
    assert_int_equal(dlock_release_shared(a, "rw"), DLOCK_OK);
    let_it_wait();
    assert_false(taker_done(&t)); /* b still reads */
    assert_int_equal(dlock_release_shared(b, "rw"), DLOCK_OK);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    fx1 = t.fence;
    assert_true(fx1 > fa && fx1 > fb);
    assert_int_equal(shared_fields("rw"), 0);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_OK);
    assert_int_equal(dlock_held(a, "rw"), 0);
    assert_int_equal(dlock_release_shared(a, "rw"), DLOCK_ENOTHELD);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(w);
}

/* S1: a second thread of the client joins the held shared lease with no
 * Redis command (the client's count and the server's), with its token. */
static void test_join_costs_no_redis_command(void **state)
{
    (void)state;
    dlock_client *c = open_client(LONG_JOIN_MS);
    uint64_t f0;
    assert_int_equal(dlock_acquire_shared(c, "join", 0, &f0), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    dlock_stats s0 = stats(c);
    long long server0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    taker t[3];
    for (int i = 0; i < 3; i++)
        taker_start(&t[i], c, "join", 1, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(taker_got(&t[i]), DLOCK_OK);
        assert_int_equal(t[i].fence, f0);
    }
    long long server1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 0);
    assert_int_equal(server1 - server0, 0);
    assert_int_equal(s1.acquisitions - s0.acquisitions, 3);
    assert_int_equal(s1.shared_acquisitions - s0.shared_acquisitions, 3);
    assert_int_equal(s1.shared_joins - s0.shared_joins, 3);
    for (int i = 0; i < 3; i++) {
        taker_finish(&t[i]);
        assert_int_equal(t[i].release_rc, DLOCK_OK);
    }
    assert_int_equal(shared_fields("join"), 1); /* the main thread still reads */
    assert_int_equal(dlock_release_shared(c, "join"), DLOCK_OK);
    assert_int_equal(shared_fields("join"), 0);
    assert_int_equal(fx_entries_settled(c), 0);
    dlock_client_close(c);
}

/* S3 locally: once a thread of the client waits exclusively, no other
 * thread joins; the readers drain and the writer gets the name. */
static void test_local_writer_stops_joins(void **state)
{
    (void)state;
    dlock_client *c = open_client(LONG_JOIN_MS);
    assert_int_equal(dlock_acquire_shared(c, "lw", 0, NULL), DLOCK_OK);
    taker wr;
    taker_start(&wr, c, "lw", 0, 10000);
    let_it_wait();
    assert_false(taker_done(&wr));
    assert_int_equal(dlock_acquire_shared(c, "lw", 0, NULL), DLOCK_OK); /* reentrant: allowed */
    taker rd;
    taker_start(&rd, c, "lw", 1, 0);
    assert_int_equal(taker_got(&rd), DLOCK_EBUSY); /* a newcomer does not join */
    taker_finish(&rd);
    assert_int_equal(dlock_release_shared(c, "lw"), DLOCK_OK);
    assert_false(taker_done(&wr));
    assert_int_equal(dlock_release_shared(c, "lw"), DLOCK_OK);
    assert_int_equal(taker_got(&wr), DLOCK_OK);
    taker_finish(&wr);
    assert_int_equal(wr.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

/* S3 across clients: a writer queued in Redis stops new shared grants to
 * other clients; the readers' client joins its threads only within its
 * join window, then waits for its lease to go back. */
static void test_remote_writer_and_the_join_window(void **state)
{
    (void)state;
    dlock_client *r = open_client(300), *w = open_client(20), *o = open_client(20);
    uint64_t fr;
    assert_int_equal(dlock_acquire_shared(r, "win", 0, &fr), DLOCK_OK);
    taker wr;
    taker_start(&wr, w, "win", 0, 20000);
    let_it_wait();
    assert_false(taker_done(&wr));
    /* another client is not granted shared beside a queued writer */
    assert_int_equal(dlock_acquire_shared(o, "win", 0, NULL), DLOCK_EBUSY);
    /* past the window (300 ms from the grant), a new thread of r waits */
    fx_sleep_ms(400);
    taker late;
    taker_start(&late, r, "win", 1, 20000);
    let_it_wait();
    assert_false(taker_done(&late));
    assert_int_equal(dlock_release_shared(r, "win"), DLOCK_OK);
    /* the writer goes first, then r's late reader */
    assert_int_equal(taker_got(&wr), DLOCK_OK);
    assert_true(wr.fence > fr);
    let_it_wait();
    assert_false(taker_done(&late));
    taker_finish(&wr);
    assert_int_equal(wr.release_rc, DLOCK_OK);
    assert_int_equal(taker_got(&late), DLOCK_OK);
    assert_true(late.fence > wr.fence);
    taker_finish(&late);
    assert_int_equal(late.release_rc, DLOCK_OK);
    dlock_client_close(r);
    dlock_client_close(w);
    dlock_client_close(o);
}

/* S8: threads waiting shared behind a local writer hold, at its release,
 * a reader phase under the client's exclusive lease: no Redis command, one
 * local pass, one token (the writer's + 1) for all of them; other clients
 * stay out (the lease in Redis is exclusive) until the phase's last
 * holder gives it back. */
static void test_reader_phase_after_local_writer(void **state)
{
    (void)state;
    dlock_client *c = open_client(LONG_JOIN_MS), *o = open_client(20);
    uint64_t fw;
    assert_int_equal(dlock_acquire(c, "inv", 0, &fw), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    taker t[3];
    for (int i = 0; i < 3; i++)
        taker_start(&t[i], c, "inv", 1, 20000);
    let_it_wait();
    for (int i = 0; i < 3; i++)
        assert_false(taker_done(&t[i]));
    dlock_stats s0 = stats(c);
    long long server0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    assert_int_equal(dlock_release(c, "inv"), DLOCK_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(taker_got(&t[i]), DLOCK_OK);
        assert_int_equal(t[i].fence, fw + 1);
    }
    long long server1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);
    assert_int_equal(server1 - server0, 0);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 0);
    assert_int_equal(s1.grants - s0.grants, 0);
    assert_int_equal(s1.handoffs - s0.handoffs, 1);
    assert_int_equal(shared_fields("inv"), 0); /* the lease in Redis is exclusive */
    assert_int_equal(dlock_acquire_shared(o, "inv", 0, NULL), DLOCK_EBUSY);
    for (int i = 0; i < 3; i++) {
        taker_finish(&t[i]);
        assert_int_equal(t[i].release_rc, DLOCK_OK);
    }
    uint64_t fo;
    assert_int_equal(dlock_acquire(o, "inv", 0, &fo), DLOCK_OK);
    assert_true(fo > fw + 1);
    assert_int_equal(dlock_release(o, "inv"), DLOCK_OK);
    dlock_client_close(c);
    dlock_client_close(o);
}

/* S8: reader phases alternate with writers' holds within the pass limit
 * (here 2): a writer, a phase (pass 1), the writer waiting behind it (pass
 * 2), then the readers waiting behind that writer ask Redis. Tokens rise
 * by one a pass. */
static void test_phases_alternate_within_the_pass_limit(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.join_ms = LONG_JOIN_MS;
    cfg.pass_limit = 2;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "alt", 0, &f0), DLOCK_OK);
    taker r1, w1, r2;
    taker_start(&r1, c, "alt", 1, 20000);
    let_it_wait();
    dlock_stats s0 = stats(c);
    assert_int_equal(dlock_release(c, "alt"), DLOCK_OK); /* a phase: pass 1 */
    assert_int_equal(taker_got(&r1), DLOCK_OK);
    assert_int_equal(r1.fence, f0 + 1);
    taker_start(&w1, c, "alt", 0, 20000); /* waits: no join beside it */
    let_it_wait();
    taker_start(&r2, c, "alt", 1, 20000);
    let_it_wait();
    assert_false(taker_done(&w1));
    assert_false(taker_done(&r2));
    taker_finish(&r1); /* the phase ends: a handoff to w1, pass 2 */
    assert_int_equal(taker_got(&w1), DLOCK_OK);
    assert_int_equal(w1.fence, f0 + 2);
    assert_int_equal(stats(c).grants - s0.grants, 0);
    taker_finish(&w1); /* the pass limit: back to Redis, r2 asks it */
    assert_int_equal(taker_got(&r2), DLOCK_OK);
    assert_true(r2.fence > f0 + 2);
    assert_int_equal(stats(c).grants - s0.grants, 1);
    taker_finish(&r2);
    assert_int_equal(r2.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

/* A writer of another client releases: the threads waiting shared in this
 * client are granted directly ("S" message) and share the grant. */
static void test_direct_shared_grant(void **state)
{
    (void)state;
    dlock_client *w = open_client(20), *c = open_client(LONG_JOIN_MS);
    uint64_t fw;
    assert_int_equal(dlock_acquire(w, "dg", 0, &fw), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    taker t[2];
    for (int i = 0; i < 2; i++)
        taker_start(&t[i], c, "dg", 1, 20000);
    let_it_wait();
    assert_int_equal(dlock_release(w, "dg"), DLOCK_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(taker_got(&t[i]), DLOCK_OK);
    assert_true(t[0].fence > fw);
    assert_int_equal(t[1].fence, t[0].fence);
    assert_int_equal(stats(c).direct_grants, 1);
    for (int i = 0; i < 2; i++) {
        taker_finish(&t[i]);
        assert_int_equal(t[i].release_rc, DLOCK_OK);
    }
    assert_int_equal(dlock_acquire(w, "dg", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(w, "dg"), DLOCK_OK);
    dlock_client_close(w);
    dlock_client_close(c);
}

/* A writer of protocol 1 (the name's data is protocol 1's, which has no
 * shared mode): the shared acquire waits, asking again, and is granted
 * once the writer released; never beside it. */
static void test_protocol_1_writer(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 1;
    dlock_client *w, *c = open_client(20);
    assert_int_equal(dlock_client_open(&cfg, &w), DLOCK_OK);
    uint64_t fw;
    assert_int_equal(dlock_acquire(w, "p1w", 0, &fw), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(c, "p1w", 0, NULL), DLOCK_EBUSY);
    taker t;
    taker_start(&t, c, "p1w", 1, 20000);
    let_it_wait();
    assert_false(taker_done(&t));
    assert_int_equal(dlock_release(w, "p1w"), DLOCK_OK);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    assert_true(t.fence > fw);
    /* the protocol 1 writer waits for the reader in turn (its try is sent
     * again in protocol 2, where the name now is) */
    assert_int_equal(dlock_acquire(w, "p1w", 0, NULL), DLOCK_EBUSY);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_OK);
    assert_int_equal(dlock_acquire(w, "p1w", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(w, "p1w"), DLOCK_OK);
    dlock_client_close(w);
    dlock_client_close(c);
}

/* S4: reentrancy, nesting under an exclusive hold, the refused upgrade. */
static void test_reentrancy_nesting_upgrade(void **state)
{
    (void)state;
    dlock_client *c = open_client(20), *o = open_client(20);
    uint64_t f1, f2;
    assert_int_equal(dlock_acquire_shared(c, "re", 0, &f1), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(c, "re", 0, &f2), DLOCK_OK);
    assert_int_equal(f2, f1);
    assert_int_equal(dlock_acquire(c, "re", 0, NULL), DLOCK_EINVAL); /* an upgrade */
    assert_non_null(strstr(dlock_last_error(), "shared"));
    assert_int_equal(dlock_release(c, "re"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_release_shared(c, "re"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "re"), 1);
    assert_int_equal(dlock_release_shared(c, "re"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "re"), 0);
    assert_int_equal(dlock_release_shared(c, "re"), DLOCK_ENOTHELD);

    /* shared under exclusive: one more level of the exclusive hold */
    uint64_t fx, fs;
    assert_int_equal(dlock_acquire(c, "re", 0, &fx), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(c, "re", 0, &fs), DLOCK_OK);
    assert_int_equal(fs, fx);
    assert_int_equal(dlock_acquire_shared(o, "re", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c, "re"), DLOCK_OK); /* the exclusive level */
    assert_int_equal(dlock_release(c, "re"), DLOCK_ENOTHELD); /* only the nested one is left */
    assert_int_equal(dlock_held(c, "re"), 1);
    assert_int_equal(dlock_acquire_shared(o, "re", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release_shared(c, "re"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "re"), 0);
    assert_int_equal(dlock_acquire_shared(o, "re", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release_shared(o, "re"), DLOCK_OK);
    dlock_client_close(c);
    dlock_client_close(o);
}

/* A thread that exits holding the name shared has it released; close
 * releases a shared lease too. */
static void test_thread_exit_and_close(void **state)
{
    (void)state;
    dlock_client *c = open_client(20), *w = open_client(20);
    taker t;
    taker_start(&t, c, "ex", 1, 0);
    t.exit_holding = 1;
    assert_int_equal(taker_got(&t), DLOCK_OK);
    taker_finish(&t);
    assert_int_equal(stats(c).abandoned, 1);
    assert_int_equal(shared_fields("ex"), 0);
    assert_int_equal(dlock_acquire(w, "ex", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(w, "ex"), DLOCK_OK);

    assert_int_equal(dlock_acquire_shared(c, "ex", 0, NULL), DLOCK_OK);
    assert_int_equal(shared_fields("ex"), 1);
    dlock_client_close(c);
    assert_int_equal(shared_fields("ex"), 0);
    assert_int_equal(dlock_acquire(w, "ex", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(w, "ex"), DLOCK_OK);
    dlock_client_close(w);
}

/* A shared hold owned by a handle: one more holder of the client's lease,
 * not the thread's (by name it releases nothing; a shared acquire of the
 * thread joins beside it), kept when the acquiring thread exits, released
 * by another thread; a writer waits for it; no handle on top of a thread's
 * own hold, shared or exclusive. */
static void test_shared_handle(void **state)
{
    (void)state;
    dlock_client *c = open_client(LONG_JOIN_MS), *w = open_client(20);
    handle_job j = {.c = c, .name = "hh", .shared = 1};
    assert_int_equal(handle_job_run(handle_job_take, &j), DLOCK_OK); /* its thread ended */
    assert_int_equal(stats(c).abandoned, 0);
    assert_int_equal(dlock_handle_held(j.h), 1);
    assert_int_equal(dlock_handle_unclean(j.h), 0);
    assert_int_equal(shared_fields("hh"), 1);
    assert_int_equal(dlock_held(c, "hh"), 0);                        /* not the thread's */
    assert_int_equal(dlock_release_shared(c, "hh"), DLOCK_ENOTHELD); /* not by name */
    uint64_t f;
    dlock_stats s0 = stats(c);
    assert_int_equal(dlock_acquire_shared(c, "hh", 0, &f), DLOCK_OK); /* joins beside it */
    assert_int_equal(stats(c).grants, s0.grants);
    assert_int_equal(f, j.fence);
    dlock_handle *h2 = NULL;
    assert_int_equal(dlock_acquire_shared_handle(c, "hh", 0, NULL, &h2), DLOCK_EINVAL);
    assert_null(h2);
    assert_int_equal(dlock_release_shared(c, "hh"), DLOCK_OK);
    assert_int_equal(shared_fields("hh"), 1); /* the handle holds it */
    assert_int_equal(dlock_acquire(c, "hx", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared_handle(c, "hx", 0, NULL, &h2), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, "hx"), DLOCK_OK);
    taker t;
    taker_start(&t, w, "hh", 0, 10000);
    let_it_wait();
    assert_false(taker_done(&t));
    assert_int_equal(handle_job_run(handle_job_release, &j), DLOCK_OK);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    assert_true(t.fence > j.fence);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_OK);
    assert_int_equal(shared_fields("hh"), 0);
    assert_int_equal(dlock_acquire_shared_handle(c, "hh", 0, NULL, NULL), DLOCK_EINVAL);
    dlock_client_close(c);
    dlock_client_close(w);
}

typedef struct with_ctx {
    dlock_client *c, *other;
    uint64_t fence;
    int held, busy;
} with_ctx;

static void with_shared_body(void *arg, uint64_t fence)
{
    with_ctx *x = arg;
    x->fence = fence;
    x->held = dlock_held(x->c, "ws");
    x->busy = dlock_acquire(x->other, "ws", 0, NULL); /* a writer beside a reader */
}

/* dlock_with_shared runs the function holding the name shared and
 * releases it; the shared guard releases at the end of its scope. */
static void test_with_and_guard_shared(void **state)
{
    (void)state;
    dlock_client *c = open_client(20), *other = open_client(20);
    with_ctx x = {.c = c, .other = other};
    assert_int_equal(dlock_with_shared(c, "ws", 0, with_shared_body, &x), DLOCK_OK);
    assert_true(x.fence > 0);
    assert_int_equal(x.held, 1);
    assert_int_equal(x.busy, DLOCK_EBUSY);
    assert_int_equal(dlock_held(c, "ws"), 0);
    assert_int_equal(shared_fields("ws"), 0);
    assert_int_equal(dlock_with_shared(c, "ws", 0, NULL, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(other, "ws", 0, NULL), DLOCK_OK);
    x.fence = 0;
    assert_int_equal(dlock_with_shared(c, "ws", 0, with_shared_body, &x), DLOCK_EBUSY);
    assert_int_equal(x.fence, 0); /* not run */
    assert_int_equal(dlock_release(other, "ws"), DLOCK_OK);
    {
        DLOCK_GUARD(g);
        uint64_t fence = 0;
        assert_int_equal(dlock_guard_acquire_shared(&g, c, "gs", 0, &fence), DLOCK_OK);
        assert_true(fence > 0);
        assert_int_equal(dlock_guard_acquire(&g, c, "gx", 0, NULL), DLOCK_EINVAL);
        assert_int_equal(dlock_guard_acquire_shared(&g, c, "gx", 0, NULL), DLOCK_EINVAL);
        assert_int_equal(dlock_held(c, "gs"), 1);
        assert_int_equal(shared_fields("gs"), 1);
    }
    assert_int_equal(dlock_held(c, "gs"), 0);
    assert_int_equal(shared_fields("gs"), 0);
    assert_int_equal(dlock_acquire(other, "gs", 0, NULL), DLOCK_OK); /* free again */
    assert_int_equal(dlock_release(other, "gs"), DLOCK_OK);
    dlock_client_close(c);
    dlock_client_close(other);
}

static int lost_calls;
static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

/* S5: a shared lease found gone is reported once (on_lost) and every
 * holder's release says DLOCK_ELOST; the name is usable after. */
static void test_lost_shared_lease(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 1500; /* renewed every 500 ms */
    cfg.join_ms = 1000;
    cfg.on_lost = on_lost;
    lost_calls = 0;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(c, "lost", 0, NULL), DLOCK_OK);
    taker t;
    taker_start(&t, c, "lost", 1, 0);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL dlock:{lost}"));
    redisFree(rc);
    /* the next renewal finds it gone: within a renewal period and a
     * command timeout; 10 s is far above that on a loaded machine */
    for (int i = 0; i < 200 && dlock_held(c, "lost"); i++)
        fx_sleep_ms(50);
    assert_int_equal(dlock_held(c, "lost"), 0);
    assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), 1);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_ELOST);
    assert_int_equal(dlock_release_shared(c, "lost"), DLOCK_ELOST);
    assert_int_equal(dlock_acquire_shared(c, "lost", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release_shared(c, "lost"), DLOCK_OK);
    assert_int_equal(fx_entries_settled(c), 0);
    dlock_client_close(c);
}

/* A shared waiter is stopped by its cancel token and by shutdown, and the
 * name is not left taken. */
static void test_cancel_and_shutdown(void **state)
{
    (void)state;
    dlock_client *w = open_client(20), *c = open_client(20);
    assert_int_equal(dlock_acquire(w, "stop", 0, NULL), DLOCK_OK);
    dlock_cancel *k;
    assert_int_equal(dlock_cancel_create(&k), DLOCK_OK);
    taker t;
    memset(&t, 0, sizeof t);
    t.c = c;
    t.name = "stop";
    t.shared = 1;
    t.wait_ms = -1;
    t.cancel = k;
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    assert_int_equal(pthread_create(&t.th, NULL, taker_main, &t), 0);
    let_it_wait();
    dlock_cancel_fire(k);
    assert_int_equal(taker_got(&t), DLOCK_ECANCELED);
    taker_finish(&t);
    dlock_cancel_destroy(k);

    taker s;
    taker_start(&s, c, "stop", 1, -1);
    let_it_wait();
    dlock_client_shutdown(c);
    assert_int_equal(taker_got(&s), DLOCK_ECLOSED);
    taker_finish(&s);
    dlock_client_close(c);
    assert_int_equal(dlock_release(w, "stop"), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(w, "stop", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release_shared(w, "stop"), DLOCK_OK);
    dlock_client_close(w);
}

/* Threads of one client mixing both modes on one name: every acquire is
 * served, and never a shared holder beside an exclusive one. */
enum { MIX_THREADS = 6, MIX_ROUNDS = 150 };
static int mix_readers, mix_writers, mix_bad;
static pthread_mutex_t mix_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct mixer {
    dlock_client *c;
    int id, fails;
} mixer;

static void *mixer_main(void *arg)
{
    mixer *m = arg;
    for (int i = 0; i < MIX_ROUNDS; i++) {
        int shared = (i + m->id) % 3 != 0;
        int rc = shared ? dlock_acquire_shared(m->c, "mix", 20000, NULL)
                        : dlock_acquire(m->c, "mix", 20000, NULL);
        if (rc != DLOCK_OK) {
            m->fails++;
            continue;
        }
        pthread_mutex_lock(&mix_mu);
        if (shared ? mix_writers > 0 : mix_writers > 0 || mix_readers > 0)
            mix_bad++;
        *(shared ? &mix_readers : &mix_writers) += 1;
        pthread_mutex_unlock(&mix_mu);
        fx_sleep_ms(i % 4 == 0 ? 1 : 0);
        pthread_mutex_lock(&mix_mu);
        *(shared ? &mix_readers : &mix_writers) -= 1;
        pthread_mutex_unlock(&mix_mu);
        rc = shared ? dlock_release_shared(m->c, "mix") : dlock_release(m->c, "mix");
        if (rc != DLOCK_OK)
            m->fails++;
    }
    return NULL;
}

static void test_mixed_modes_storm(void **state)
{
    (void)state;
    dlock_client *c[2] = {open_client(20), open_client(20)};
    mixer m[MIX_THREADS];
    pthread_t th[MIX_THREADS];
    mix_bad = mix_readers = mix_writers = 0;
    for (int i = 0; i < MIX_THREADS; i++) {
        m[i] = (mixer){.c = c[i % 2], .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, mixer_main, &m[i]), 0);
    }
    for (int i = 0; i < MIX_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(m[i].fails, 0);
    }
    assert_int_equal(mix_bad, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fx_entries_settled(c[i]), 0);
        dlock_client_close(c[i]);
    }
}

/* A name whose data is a semaphore's (lua/p2/SEM.txt) is refused to the
 * lock, as a server-side error no retry cures (DLOCK_ESERVER), naming the
 * semaphore; the semaphore is left as it was. */
static void test_semaphore_name_refused(void **state)
{
    (void)state;
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "HSET dlock:{sem1} pv 2 k s l 3"));
    dlock_client *c = open_client(20);
    assert_int_equal(dlock_acquire(c, "sem1", 0, NULL), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "semaphore"));
    assert_int_equal(dlock_acquire_shared(c, "sem1", 0, NULL), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "semaphore"));
    redisReply *r = redisCommand(rc, "HLEN dlock:{sem1}");
    assert_int_equal(r->integer, 3);
    freeReplyObject(r);
    freeReplyObject(redisCommand(rc, "DEL dlock:{sem1}"));
    redisFree(rc);
    dlock_client_close(c);
}

/* Bad input: a NULL client or name; join_ms above the lease. */
static void test_bad_input(void **state)
{
    (void)state;
    assert_int_equal(dlock_acquire_shared(NULL, "x", 0, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_release_shared(NULL, "x"), DLOCK_EINVAL);
    dlock_client *c = open_client(20);
    assert_int_equal(dlock_acquire_shared(c, NULL, 0, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_release_shared(c, ""), DLOCK_EINVAL);
    dlock_client_close(c);
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.join_ms = cfg.lease_ms + 1;
    dlock_client *bad = NULL;
    assert_int_equal(dlock_client_open(&cfg, &bad), DLOCK_EINVAL);
    assert_null(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_readers_share_writer_waits, fx_ensure_server),
        cmocka_unit_test_teardown(test_join_costs_no_redis_command, fx_ensure_server),
        cmocka_unit_test_teardown(test_local_writer_stops_joins, fx_ensure_server),
        cmocka_unit_test_teardown(test_remote_writer_and_the_join_window, fx_ensure_server),
        cmocka_unit_test_teardown(test_reader_phase_after_local_writer, fx_ensure_server),
        cmocka_unit_test_teardown(test_phases_alternate_within_the_pass_limit,
                                  fx_ensure_server),
        cmocka_unit_test_teardown(test_direct_shared_grant, fx_ensure_server),
        cmocka_unit_test_teardown(test_protocol_1_writer, fx_ensure_server),
        cmocka_unit_test_teardown(test_reentrancy_nesting_upgrade, fx_ensure_server),
        cmocka_unit_test_teardown(test_thread_exit_and_close, fx_ensure_server),
        cmocka_unit_test_teardown(test_shared_handle, fx_ensure_server),
        cmocka_unit_test_teardown(test_with_and_guard_shared, fx_ensure_server),
        cmocka_unit_test_teardown(test_lost_shared_lease, fx_ensure_server),
        cmocka_unit_test_teardown(test_cancel_and_shutdown, fx_ensure_server),
        cmocka_unit_test_teardown(test_mixed_modes_storm, fx_ensure_server),
        cmocka_unit_test_teardown(test_semaphore_name_refused, fx_ensure_server),
        cmocka_unit_test_teardown(test_bad_input, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
