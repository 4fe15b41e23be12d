/*
 * One side of the rolling-upgrade test (scripts/upgrade-test): a process
 * linked to one release of dlock, run beside a process linked to another on
 * one Redis and one key prefix. It uses only the calls every release since
 * protocol versions began has (dlock_config_init, dlock_client_open,
 * dlock_acquire, dlock_release, dlock_last_error, dlock_err_name,
 * dlock_version, dlock_client_close), so the same source builds against
 * each.
 *
 *   upgrade_peer run SOCKET PREFIX SHM ID SECONDS
 *       4 threads take the names u0 and u1 in turn for SECONDS; each
 *       critical section checks, in a file mapped by both peers (SHM), that
 *       nobody else is inside (occupancy), that the fencing token is above
 *       the last one any holder of the name got, and counts the
 *       acquisitions that follow a holder of the other peer (cross), and
 *       the calls refused because the name's data is of a protocol its
 *       release does not speak (refused; with UPGRADE_PEER_REFUSALS=1
 *       they are expected, else errors). Prints "peer ID VERSION: A
 *       acquisitions, C cross, O overlaps, R tokens out of order, F
 *       refused, E errors"; exit 0 when O, R and E are 0.
 *   upgrade_peer refuse SOCKET PREFIX NAME
 *       takes NAME (free), says "held" and waits for a line on stdin (the
 *       test marks NAME's data as protocol 3's meanwhile), then releases
 *       it, tries it once and waits for it 300 ms: exit 0 if all three
 *       fail with DLOCK_ESERVER and a message naming protocol 3.
 *
 * UPGRADE_PEER_PROTOCOL=P sets dlock_config.protocol, in releases that
 * have it (DLOCK_PROTOCOL_HIGHEST defined).
 *
 * State shared across the two processes: SHM, a MAP_SHARED array of one
 * slot per name. occupancy is changed with atomic adds; last_token and
 * last_peer are read and written only inside the critical section, so the
 * lock under test orders them (which is what the check checks).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <dlock.h>

#define NAMES 2
#define THREADS 4

typedef struct slot {
    int occupancy;
    int last_peer;
    uint64_t last_token;
} slot;

static slot *shm;
static dlock_client *client;
static int peer_id;
static double run_seconds;
static long acquisitions, cross, overlaps, regressions, errors, refusals;
static int refusals_expected;

/* A call refused because the name's data is of a protocol this release
 * does not speak. */
static int is_refusal(int rc)
{
    return rc == DLOCK_ESERVER && strstr(dlock_last_error(), "dlock protocol ");
}
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + (unsigned)peer_id;
    long a = 0, x = 0, o = 0, r = 0, e = 0, f = 0;
    double end = now_s() + run_seconds;
    while (now_s() < end) {
        int n = (int)(rand_r(&seed) % NAMES);
        char name[8];
        snprintf(name, sizeof name, "u%d", n);
        uint64_t token = 0;
        int rc = dlock_acquire(client, name, 2000, &token);
        if (rc == DLOCK_ETIMEDOUT)
            continue;
        if (refusals_expected && is_refusal(rc)) {
            f++;
            continue;
        }
        if (rc != DLOCK_OK) {
            if (e++ == 0)
                fprintf(stderr, "peer %d: acquire %s: %s\n", peer_id, name, dlock_last_error());
            continue;
        }
        slot *s = &shm[n];
        if (__atomic_fetch_add(&s->occupancy, 1, __ATOMIC_SEQ_CST) != 0)
            o++;
        if (token <= s->last_token)
            r++;
        if (s->last_peer != 0 && s->last_peer != peer_id)
            x++;
        s->last_token = token;
        s->last_peer = peer_id;
        a++;
        struct timespec cs = {0, 200 * 1000}; /* 200 us inside */
        nanosleep(&cs, NULL);
        __atomic_fetch_sub(&s->occupancy, 1, __ATOMIC_SEQ_CST);
        rc = dlock_release(client, name);
        if (rc != DLOCK_OK && refusals_expected && is_refusal(rc))
            f++;
        else if (rc != DLOCK_OK && e++ == 0)
            fprintf(stderr, "peer %d: release %s: %s\n", peer_id, name, dlock_last_error());
        struct timespec think = {0, (long)(rand_r(&seed) % 500) * 1000};
        nanosleep(&think, NULL);
    }
    pthread_mutex_lock(&count_mu);
    acquisitions += a;
    cross += x;
    overlaps += o;
    regressions += r;
    errors += e;
    refusals += f;
    pthread_mutex_unlock(&count_mu);
    return NULL;
}

static int open_client(const char *sock, const char *prefix)
{
    dlock_config cfg;
    dlock_config_init(&cfg);
    cfg.redis_unix_path = sock;
    cfg.key_prefix = prefix;
    cfg.lease_ms = 5000;
#ifdef DLOCK_PROTOCOL_HIGHEST
    const char *p = getenv("UPGRADE_PEER_PROTOCOL");
    if (p && *p)
        cfg.protocol = (uint32_t)atoi(p);
#endif
    int rc = dlock_client_open(&cfg, &client);
    if (rc != DLOCK_OK)
        fprintf(stderr, "upgrade_peer: open: %s\n", dlock_last_error());
    return rc;
}

static int run(char **argv)
{
    peer_id = atoi(argv[5]);
    const char *x = getenv("UPGRADE_PEER_REFUSALS");
    refusals_expected = x && strcmp(x, "1") == 0;
    run_seconds = atof(argv[6]);
    int fd = open(argv[4], O_RDWR);
    if (fd < 0 || peer_id <= 0 || run_seconds <= 0) {
        fprintf(stderr, "upgrade_peer: bad SHM, ID or SECONDS (%s)\n", strerror(errno));
        return 2;
    }
    shm = mmap(NULL, NAMES * sizeof(slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (shm == MAP_FAILED || open_client(argv[2], argv[3]) != DLOCK_OK)
        return 2;
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    dlock_client_close(client);
    printf("peer %d %s: %ld acquisitions, %ld cross, %ld overlaps, %ld tokens out of order, "
           "%ld refused, %ld errors\n", peer_id, dlock_version(), acquisitions, cross, overlaps,
           regressions, refusals, errors);
    return overlaps || regressions || errors ? 1 : 0;
}

/* Prints what call `what` returned; whether it was a refusal of protocol 3's
 * data. */
static int refused(const char *what, int rc)
{
    printf("%s %s: %s: %s\n", dlock_version(), what, dlock_err_name(rc), dlock_last_error());
    fflush(stdout);
    return rc == DLOCK_ESERVER && strstr(dlock_last_error(), "dlock protocol 3");
}

static int refuse(char **argv)
{
    const char *name = argv[4];
    if (open_client(argv[2], argv[3]) != DLOCK_OK)
        return 2;
    int rc = dlock_acquire(client, name, 0, NULL);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "upgrade_peer: %s is not free: %s\n", name, dlock_last_error());
        dlock_client_close(client);
        return 1;
    }
    printf("held\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* marked meanwhile */
        dlock_client_close(client);
        return 2;
    }
    int ok = refused("release", dlock_release(client, name));
    ok &= refused("try", dlock_acquire(client, name, 0, NULL));
    ok &= refused("wait", dlock_acquire(client, name, 300, NULL));
    dlock_client_close(client);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 7 && strcmp(argv[1], "run") == 0)
        return run(argv);
    if (argc == 5 && strcmp(argv[1], "refuse") == 0)
        return refuse(argv);
    fprintf(stderr, "usage: upgrade_peer run SOCKET PREFIX SHM ID SECONDS\n"
                    "       upgrade_peer refuse SOCKET PREFIX NAME\n");
    return 2;
}
