/*
 * Fencing recipes (docs/guide.md, "Fencing") against real servers: a lock server
 * (fx_server) and a store, a second redis-server that keeps the protected
 * data, or an SQLite database for the SQL recipe.
 *
 * The workload is the racy read-modify-write a user runs under a lock:
 * read a counter, add one, write it back. Two holders of one name, A then B,
 * and A's lease is lost between its read and its write, either by a restart
 * of the lock server without persistence or by a pause (SIGSTOP) of A's
 * process past its lease. The interleaving that loses an update is made
 * on purpose: A reads, B acquires and reads, A writes, B writes. Each store
 * reports whether a write went in; an update is lost when a write went in
 * and the counter does not show it.
 *   - the recipe (dlock_fenced_script, and the SQL statements of the user guide):
 *     the token goes with the read too, and any operation below the highest
 *     token seen is refused: A's write is refused, nothing is lost, and B may
 *     write twice under its grant;
 *   - the advice the docs gave before (check the token at write time
 *     only, with '>'): A's write goes in between B's read and B's write, and
 *     one update is lost; B's second write under the same grant is refused.
 * The counts are exact: the interleaving is fixed, no timing decides it.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "dlock.h"
#include "fixture.h"

static fx_redis store_srv; /* the application's Redis, never restarted */

/* The docs' earlier advice: the token checked when writing only, and
 * with '>', in the same shape as the recipe's script. */
static const char OLD_ADVICE[] =
    "if ARGV[2] == 'get' then return {1, redis.call('HGET', KEYS[1], ARGV[3]) or false} end\n"
    "local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '0')\n"
    "if tonumber(ARGV[1]) > last then\n"
    "  redis.call('HSET', KEYS[1], 'last', ARGV[1], ARGV[3], ARGV[4])\n"
    "  return {1}\n"
    "end\n"
    "return {0, tostring(last)}\n";

/* One store: a Redis hash through a script, or an SQLite row. */
typedef struct store {
    const char *script;    /* Redis: the script's text; NULL: SQL */
    int old;               /* SQL: the earlier advice instead of the recipe */
    redisContext *redis;
    sqlite3 *db;
    const char *key;       /* Redis: the hash; SQL: the row's id */
} store;

/* Reads the counter with token t: 1 and *v, or 0 when refused. */
static int store_get(store *s, uint64_t t, long *v)
{
    char tok[24];
    snprintf(tok, sizeof tok, "%" PRIu64, t);
    if (s->script) {
        redisReply *r = redisCommand(s->redis, "EVAL %s 1 %s %s get n", s->script, s->key, tok);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
            fail_msg("store get: %s", r->str);
        assert_int_equal(r->type, REDIS_REPLY_ARRAY);
        int ok = r->element[0]->integer == 1;
        if (ok)
            *v = r->element[1]->type == REDIS_REPLY_STRING ? atol(r->element[1]->str) : 0;
        freeReplyObject(r);
        return ok;
    }
    /* the recipe: the read claims the row for the token, or finds a later one */
    const char *sql = s->old ? "SELECT balance FROM account WHERE id = ?2"
                             : "UPDATE account SET fence = ?1 WHERE id = ?2 AND fence <= ?1 "
                               "RETURNING balance";
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(s->db, sql, -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, (sqlite3_int64)t);
    sqlite3_bind_text(st, 2, s->key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int ok = rc == SQLITE_ROW;
    if (ok)
        *v = (long)sqlite3_column_int64(st, 0);
    else
        assert_int_equal(rc, SQLITE_DONE);
    sqlite3_finalize(st);
    return ok;
}

/* Writes the counter with token t: 1 if it went in, 0 if refused. */
static int store_set(store *s, uint64_t t, long v)
{
    char tok[24], val[24];
    snprintf(tok, sizeof tok, "%" PRIu64, t);
    snprintf(val, sizeof val, "%ld", v);
    if (s->script) {
        redisReply *r =
            redisCommand(s->redis, "EVAL %s 1 %s %s set n %s", s->script, s->key, tok, val);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
            fail_msg("store set: %s", r->str);
        int ok = r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 1;
        freeReplyObject(r);
        return ok;
    }
    const char *sql = s->old ? "UPDATE account SET balance = ?3, fence = ?1 "
                               "WHERE id = ?2 AND fence < ?1"
                             : "UPDATE account SET balance = ?3, fence = ?1 "
                               "WHERE id = ?2 AND fence <= ?1";
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(s->db, sql, -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, (sqlite3_int64)t);
    sqlite3_bind_text(st, 2, s->key, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, v);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    return sqlite3_changes(s->db) == 1;
}

/* The counter as stored, read without any check. */
static long store_value(store *s)
{
    long v = 0;
    if (s->script) {
        redisReply *r = redisCommand(s->redis, "HGET %s n", s->key);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_STRING)
            v = atol(r->str);
        freeReplyObject(r);
        return v;
    }
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(s->db, "SELECT balance FROM account WHERE id = ?1", -1,
                                        &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(st, 1, s->key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        v = (long)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static dlock_client *open_lock_client(uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tf:";
    cfg.lease_ms = lease_ms;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* What one run gave: writes that went in, updates lost, and whether B's
 * second write under its grant went in. */
typedef struct outcome {
    int acked, lost, b_again;
} outcome;

/* The lock server restarts without persistence while A holds the name
 * between its read and its write. */
static outcome restart_between(store *s, const char *name)
{
    dlock_client *a = open_lock_client(5000), *b = open_lock_client(5000);
    long before = store_value(s), va = -1, vb = -1;
    uint64_t ta = 0, tb = 0;
    assert_int_equal(dlock_acquire(a, name, 5000, &ta), DLOCK_OK);
    assert_int_equal(store_get(s, ta, &va), 1);
    /* Redis forgets A's lease: B is granted the name at once */
    assert_int_equal(fx_redis_restart(&fx_server), 0);
    assert_int_equal(dlock_acquire(b, name, 10000, &tb), DLOCK_OK);
    assert_true(tb > ta); /* test_script: a restart does not undercut a token */
    assert_int_equal(store_get(s, tb, &vb), 1);
    int wa = store_set(s, ta, va + 1); /* A, unaware, writes */
    int wb = store_set(s, tb, vb + 1);
    outcome o = {wa + wb, 0, store_set(s, tb, vb + 1)};
    o.lost = o.acked - (int)(store_value(s) - before);
    dlock_release(b, name);
    (void)dlock_release(a, name); /* DLOCK_ELOST: Redis lost it */
    dlock_client_close(a);
    dlock_client_close(b);
    return o;
}

/* The recipe in a Redis hash through dlock_fenced_script, and the earlier
 * advice, across a restart of the lock server. */
static void test_redis_store_across_restart(void **state)
{
    (void)state;
    redisContext *k = fx_connect("127.0.0.1", store_srv.port);
    assert_non_null(k);
    store recipe = {dlock_fenced_script(), 0, k, NULL, "store:r1"};
    outcome o = restart_between(&recipe, "r1");
    fprintf(stderr, "# recipe, Redis store, restart: %d writes went in, %d updates lost\n",
            o.acked, o.lost);
    assert_int_equal(o.acked, 1); /* B's only: A's was refused */
    assert_int_equal(o.lost, 0);
    assert_int_equal(o.b_again, 1); /* equal tokens pass */

    store old = {OLD_ADVICE, 0, k, NULL, "store:r2"};
    o = restart_between(&old, "r2");
    fprintf(stderr, "# earlier advice, Redis store, restart: %d writes went in, %d updates lost\n",
            o.acked, o.lost);
    assert_int_equal(o.acked, 2);
    assert_int_equal(o.lost, 1);
    assert_int_equal(o.b_again, 0); /* '>' refuses B's second write */
    redisFree(k);
}

/* The SQL recipe of the user guide (SQLite here), and the earlier advice. */
static void test_sql_store_across_restart(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/fencing.db", store_srv.dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TABLE account (id TEXT PRIMARY KEY, balance INTEGER "
                                  "NOT NULL, fence INTEGER NOT NULL DEFAULT 0);"
                                  "INSERT INTO account (id, balance) VALUES ('s1', 0), ('s2', 0);",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    store recipe = {NULL, 0, NULL, db, "s1"};
    outcome o = restart_between(&recipe, "s1");
    fprintf(stderr, "# recipe, SQL store, restart: %d writes went in, %d updates lost\n", o.acked,
            o.lost);
    assert_int_equal(o.acked, 1);
    assert_int_equal(o.lost, 0);
    assert_int_equal(o.b_again, 1);

    store old = {NULL, 1, NULL, db, "s2"};
    o = restart_between(&old, "s2");
    fprintf(stderr, "# earlier advice, SQL store, restart: %d writes went in, %d updates lost\n",
            o.acked, o.lost);
    assert_int_equal(o.acked, 2);
    assert_int_equal(o.lost, 1);
    assert_int_equal(o.b_again, 0);
    sqlite3_close(db);
}

/* Child mode: holder A in a process of its own, so that it can be paused
 * (SIGSTOP) past its lease. Acquires `name` (lease 500 ms), reads the
 * counter through the script given by `which` ("recipe" or "old"), prints
 * "<token> <value>", waits for a line on stdin, writes value + 1 and prints
 * 1 or 0. */
static int pause_child(int lock_port, int store_port, const char *which, const char *name)
{
    fx_server.port = lock_port;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tf:";
    cfg.lease_ms = 500;
    dlock_client *c = NULL;
    uint64_t t = 0;
    if (dlock_client_open(&cfg, &c) != DLOCK_OK || dlock_acquire(c, name, 5000, &t) != DLOCK_OK)
        return 3;
    redisContext *k = redisConnect("127.0.0.1", store_port);
    if (!k || k->err)
        return 4;
    store s = {strcmp(which, "old") ? dlock_fenced_script() : OLD_ADVICE, 0, k, NULL, NULL};
    char key[64];
    snprintf(key, sizeof key, "store:%s", name);
    s.key = key;
    long v = -1;
    if (!store_get(&s, t, &v))
        return 5;
    printf("%" PRIu64 " %ld\n", t, v);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 6;
    printf("%d\n", store_set(&s, t, v + 1));
    fflush(stdout);
    _exit(0); /* (its lease is lost: nothing to release) */
}

/* A is paused past its lease between its read and its write; B gets the
 * name when A's lease runs out. */
static outcome pause_between(const char *which, const char *name)
{
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    char lp[16], sp[16];
    snprintf(lp, sizeof lp, "%d", fx_server.port);
    snprintf(sp, sizeof sp, "%d", store_srv.port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl("/proc/self/exe", "test_fencing", "--pause-child", lp, sp, which, name,
              (char *)NULL);
        _exit(7);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE *in = fdopen(from_child[0], "r");
    assert_non_null(in);
    char line[64];
    if (!fgets(line, sizeof line, in)) /* blocks until A has read: a child's start */
        fail_msg("holder A (child) reported nothing");
    uint64_t ta = strtoull(line, NULL, 10);
    long va = atol(strchr(line, ' ') + 1);
    assert_true(ta > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0); /* A stops renewing: its 500 ms lease runs out */

    redisContext *k = fx_connect("127.0.0.1", store_srv.port);
    char key[64];
    snprintf(key, sizeof key, "store:%s", name);
    store s = {strcmp(which, "old") ? dlock_fenced_script() : OLD_ADVICE, 0, k, NULL, key};
    dlock_client *b = open_lock_client(5000);
    uint64_t tb = 0;
    long vb = -1;
    /* bounded by A's lease (500 ms); 10 s for a loaded machine */
    assert_int_equal(dlock_acquire(b, name, 10000, &tb), DLOCK_OK);
    assert_true(tb > ta);
    assert_int_equal(store_get(&s, tb, &vb), 1);
    assert_int_equal(vb, va);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(write(to_child[1], "go\n", 3), 3); /* A, unaware, writes */
    if (!fgets(line, sizeof line, in))
        fail_msg("holder A (child) did not report its write");
    int wa = atoi(line);
    int wb = store_set(&s, tb, vb + 1);
    outcome o = {wa + wb, 0, store_set(&s, tb, vb + 1)};
    o.lost = o.acked - (int)(store_value(&s) - va);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    fclose(in);
    close(to_child[1]);
    assert_int_equal(dlock_release(b, name), DLOCK_OK);
    dlock_client_close(b);
    redisFree(k);
    return o;
}

static void test_redis_store_across_pause(void **state)
{
    (void)state;
    outcome o = pause_between("recipe", "p1");
    fprintf(stderr, "# recipe, Redis store, pause: %d writes went in, %d updates lost\n", o.acked,
            o.lost);
    assert_int_equal(o.acked, 1);
    assert_int_equal(o.lost, 0);
    assert_int_equal(o.b_again, 1);
    o = pause_between("old", "p2");
    fprintf(stderr, "# earlier advice, Redis store, pause: %d writes went in, %d updates lost\n",
            o.acked, o.lost);
    assert_int_equal(o.acked, 2);
    assert_int_equal(o.lost, 1);
    assert_int_equal(o.b_again, 0);
}

/* The script's own contract: reads and writes of several fields, nil for a
 * missing one, refusals that change nothing, bad arguments. */
static void test_script_contract(void **state)
{
    (void)state;
    redisContext *k = fx_connect("127.0.0.1", store_srv.port);
    const char *s = dlock_fenced_script();
    assert_non_null(s);
    redisReply *r = redisCommand(k, "EVAL %s 1 c 100 set a 1 b 2", s);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 1);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 100 get a b zz", s);
    assert_int_equal(r->elements, 4);
    assert_string_equal(r->element[1]->str, "1");
    assert_string_equal(r->element[2]->str, "2");
    assert_int_equal(r->element[3]->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 99 set a 7", s); /* below 100: refused */
    assert_int_equal(r->element[0]->integer, 0);
    assert_string_equal(r->element[1]->str, "100");
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 99 get a", s);
    assert_int_equal(r->element[0]->integer, 0);
    freeReplyObject(r);
    r = redisCommand(k, "HGET c a");
    assert_string_equal(r->str, "1"); /* unchanged */
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 1795000000000000 get a", s); /* a real token's size */
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 1795000000000001 set a 8", s);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
    r = redisCommand(k, "EVAL %s 1 c 1795000000000000 set a 9", s); /* one below */
    assert_int_equal(r->element[0]->integer, 0);
    assert_string_equal(r->element[1]->str, "1795000000000001");
    freeReplyObject(r);
    const char *bad[] = {"EVAL %s 1 c x get a", "EVAL %s 1 c 0 get a", "EVAL %s 1 c 2e20 get a",
                         "EVAL %s 1 c 1795000000000002 set a", "EVAL %s 1 c 1795000000000002 del a",
                         "EVAL %s 1 c 1795000000000002 set fence 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = redisCommand(k, bad[i], s);
        assert_int_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
    }
    r = redisCommand(k, "HGET c fence");
    assert_string_equal(r->str, "1795000000000001"); /* no bad call changed it */
    freeReplyObject(r);
    redisFree(k);
}

static int setup(void **state)
{
    if (fx_group_setup(state) != 0)
        return -1;
    return fx_redis_start(&store_srv) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    fx_redis_stop(&store_srv);
    return fx_group_teardown(state);
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--pause-child"))
        return pause_child(atoi(argv[2]), atoi(argv[3]), argv[4], argv[5]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_script_contract),
        cmocka_unit_test_teardown(test_redis_store_across_restart, fx_ensure_server),
        cmocka_unit_test_teardown(test_sql_store_across_restart, fx_ensure_server),
        cmocka_unit_test_teardown(test_redis_store_across_pause, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
