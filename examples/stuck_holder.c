/*
 * A worker stuck while holding a lock: it takes "invoice:7" and never lets
 * go, like a process wedged on a hung downstream call. Its lease stays
 * renewed, so the lock never frees by itself; an operator finds it with
 * `dlockctl list`, sees who holds it with `dlockctl show`, and frees it with
 * `dlockctl release invoice:7 --force` (examples/oncall.sh runs that
 * session). The worker learns at once: its log callback prints the
 * operator's action, dlock_held() drops to 0 and on_lost runs, and it stops
 * instead of writing with a lease it no longer has.
 *
 *   stuck_holder [-h HOST:PORT | -s UNIX_SOCKET]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlock.h>

static void on_log(int level, const char *message, void *arg)
{
    (void)arg;
    fprintf(stderr, "stuck_holder log[%s]: %s\n",
            level == DLOCK_LOG_ERROR ? "error" : level == DLOCK_LOG_WARN ? "warn" : "info",
            message);
}

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)arg;
    fprintf(stderr, "stuck_holder: lost %s (token %llu): stopping the work under it\n", name,
            (unsigned long long)fence);
}

int main(int argc, char **argv)
{
    dlock_config cfg;
    dlock_config_init(&cfg);
    char host[256];
    if (argc == 3 && !strcmp(argv[1], "-s")) {
        cfg.redis_host = NULL;
        cfg.redis_unix_path = argv[2];
    } else if (argc == 3 && !strcmp(argv[1], "-h") && strrchr(argv[2], ':')) {
        const char *colon = strrchr(argv[2], ':');
        snprintf(host, sizeof host, "%.*s", (int)(colon - argv[2]), argv[2]);
        cfg.redis_host = host;
        cfg.redis_port = atoi(colon + 1);
    } else if (argc != 1) {
        fprintf(stderr, "usage: stuck_holder [-h HOST:PORT | -s UNIX_SOCKET]\n");
        return 2;
    }
    cfg.key_prefix = "example:";
    cfg.client_name = "stuck-holder";
    cfg.on_log = on_log;
    cfg.on_lost = on_lost;
    dlock_client *c;
    int rc = dlock_client_open(&cfg, &c);
    if (rc == DLOCK_OK)
        rc = dlock_acquire(c, "invoice:7", 5000, NULL);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "stuck_holder: %s: %s\n", dlock_strerror(rc), dlock_last_error());
        return 1;
    }
    printf("holding invoice:7\n");
    fflush(stdout);
    /* "stuck": holds on for up to a minute, checking the lease */
    for (int i = 0; i < 600 && dlock_held(c, "invoice:7"); i++)
        usleep(100 * 1000);
    int lost = !dlock_held(c, "invoice:7");
    rc = dlock_release(c, "invoice:7"); /* DLOCK_ELOST after a forced release */
    printf("%s; release: %s\n", lost ? "the lease was taken away" : "still held after a minute",
           dlock_err_name(rc));
    dlock_client_close(c);
    return lost && rc == DLOCK_ELOST ? 0 : 1;
}
