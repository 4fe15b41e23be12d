/*
 * dlockctl: who holds a dlock lock or semaphore, who waits for it, and a
 * forced release of a lock, for operators.
 *
 *   dlockctl [connection options] [--json] list [PATTERN]
 *   dlockctl [connection options] [--json] show NAME
 *   dlockctl [connection options] [--json] release NAME --force
 *   dlockctl [connection options] [--json] release --client ID --force
 *   dlockctl [connection options] [--json] watch NAME [--interval MS] [--count N]
 *   dlockctl --redlock-nodes LIST [options] [--json] seed-fresh
 *   dlockctl --redlock-nodes LIST [options] [--json] list [PATTERN] | show NAME | watch NAME
 *
 * It connects as the library does (host and port, a Unix socket, an ACL user
 * and password, Sentinel, Cluster; the same key prefix) and reads the data
 * the library keeps per lock name (docs/design.md: How it works): the lease hash
 * <prefix>{<name>} (owner id, token, name of the owner's client, time of
 * the grant), its remaining time, the wait queue <prefix>{<name>}:q and the
 * waiters' liveness <prefix>{<name>}:qd. `list` walks the keys with SCAN
 * (never KEYS), on every master in Cluster mode.
 *
 * It reads and releases the data of both protocols this release speaks
 * (1 and 2: the first step of the roll between them, docs/design.md,
 * "Protocol versions"), each name with its protocol's scripts (protocol
 * 2's data is one hash at the same key: lua/p2/LAYOUT.txt), and refuses
 * data of any other protocol, changing nothing.
 *
 * A forced release runs the library's own release script (of the name's
 * protocol) as the holder (so the next live waiter is granted the lease
 * and told, as after any release) with a fence (protocol 2: the slot's
 * mark) far enough ahead that no token the holder may have handed to its
 * threads is reached again, then tells the holder on its channel ("f
 * <token> <name>"): the holder checks with Redis at once, its
 * dlock_held() drops to 0, on_lost runs and its on_log callback says an
 * operator did it.
 *
 * Exit status: 0 done; 1 the name is not held (show, release) or Redis
 * failed; 2 bad usage.
 *
 * This file parses the command line and runs one command; the others are
 * named in dlockctl.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlockctl.h"
#include "common/error.h"
#include "conn/script.h"

ctl_options O = {.host = "127.0.0.1", .port = 6379, .prefix = "dlock:", .interval_ms = 500,
                 .count = -1};
dlock_conn_cfg CFG;
dlock_master MASTER;
dlock_cluster *CL;
dlock_counters CTR;

static void usage(FILE *f)
{
    fprintf(f,
"usage: dlockctl [options] COMMAND [ARGS]\n"
"Shows who holds dlock locks and semaphores and who waits for them; releases a\n"
"lock by force.\n"
"\n"
"commands:\n"
"  list [PATTERN]        held locks and semaphores with permits in use whose name\n"
"                        matches PATTERN (a glob, default *): name, holder (client\n"
"                        name and id; or how many clients hold it shared; or, for\n"
"                        a semaphore, its permits in use of its limit and how many\n"
"                        clients hold them), token, remaining lease, held for,\n"
"                        waiting clients\n"
"  show NAME             one lock: its holder (or each client holding it shared,\n"
"                        with its token), the protocol of its data, and its wait\n"
"                        queue (each waiter's client, name, time in the queue,\n"
"                        whether it waits to share it, alive or not); a semaphore:\n"
"                        its permits in use, each holder's client with its permits\n"
"                        and lease left, its kind and limit, and its wait queue\n"
"                        (with the permits each waiter wants)\n"
"  release NAME --force  removes the lease now, tells the holder at once (its\n"
"                        dlock_held() drops to 0, on_lost runs, its log says so)\n"
"                        and hands the lock to the next live waiter, which is told\n"
"                        (dlock_unclean: DLOCK_UNCLEAN_FORCED); exclusive grants\n"
"                        only: a name held shared, or a semaphore, is left alone\n"
"                        (exit 1)\n"
"  release --client ID --force\n"
"                        the same for every lock the client ID holds (a dead\n"
"                        process's: its id is in list's HOLDER column and in\n"
"                        dlock_client_id())\n"
"  watch NAME            shows NAME again every --interval MS (default 500) until\n"
"                        interrupted, or --count N times\n"
"  doctor                checks the server (every master of a cluster) against\n"
"                        what dlock needs: version, eviction policy, role,\n"
"                        persistence, replicas; says what to change\n"
"  seed-fresh            Redlock mode (--redlock-nodes): seeds a fresh deployment\n"
"                        once, before any client runs: gives every node its run\n"
"                        id in its seed key (\"<prefix>redlock:seed\"), so that\n"
"                        its votes count; refused, writing nothing, unless every\n"
"                        node answers and holds no key of the prefix (a node\n"
"                        with data, or restarted, is seeded by the clients from\n"
"                        the others, never fresh)\n"
"  with --redlock-nodes, list, show and watch read every node: per name, what\n"
"  each node says (holder, token, lease left; down; or not seeded: its seed\n"
"  key does not hold its run id, so its votes do not count) and the holder a\n"
"  majority of the counting nodes agree on, with the highest token they\n"
"  granted it (show: exit 1 without such a majority); a semaphore's name,\n"
"  its limit and each of its slots' majority holder (show: exit 0 while a\n"
"  slot is held); release and doctor work on one node (--host)\n"
"\n"
"Each lock is read in one step (a script: a consistent snapshot); a waiter is\n"
"alive by the server's clock; names are printed with control characters\n"
"escaped (\\xNN); list is sorted by name. Data of dlock protocol 1 and 2 is\n"
"read and released alike, each name by its protocol's scripts; a name of\n"
"another protocol is refused (show, release NAME: exit 1) or passed by with\n"
"a warning (list, release --client), and left as it is.\n"
"\n"
"connection (as the library's dlock_config; the short options as redis-cli's):\n"
"  -h, --host HOST[:PORT] the server (default 127.0.0.1:6379; IPv6: ADDR or [ADDR]:PORT)\n"
"  -p, --port PORT        its port (default 6379)\n"
"  -s, --socket PATH      a Unix socket instead\n"
"      --cluster LIST     Redis Cluster seed nodes \"host:port,...\"\n"
"      --sentinels LIST   Sentinel mode: the sentinels \"host:port,...\", with\n"
"      --master NAME      the master's name (and --sentinel-password PW)\n"
"      --redlock-nodes LIST  Redlock mode's masters \"host:port,...\" (seed-fresh,\n"
"                         list, show, watch; release and doctor: one node with\n"
"                         --host)\n"
"  -u, --user USER        an ACL user (with --password)\n"
"  -a, --password PW      AUTH password (or the DLOCK_PASSWORD environment variable)\n"
"  -n, --db N             the database (default 0)\n"
"      --prefix PREFIX    the key_prefix of the clients (default dlock:)\n"
"      --json             JSON instead of text (list: an array; show, release: an\n"
"                         object; watch: one object per line); each lock or\n"
"                         semaphore says its \"kind\"\n"
"      --help             this text\n"
"      --version          dlockctl's version and protocol (the library's), and\n"
"                         the protocols it reads\n"
"Exit status: 0 done; 1 not held (show, release), nothing released (release\n"
"--client), something to change (doctor), or a Redis failure; 2 bad usage.\n");
}

void ctl_die_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "dlockctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (dlockctl --help)\n");
    exit(2);
}

void ctl_die(const char *what)
{
    fprintf(stderr, "dlockctl: %s: %s\n", what, dlock_last_error());
    exit(1);
}


/* The whole number s, from min to max, for option `what`; bad usage
 * otherwise. */
static long number(const char *s, const char *what, long min, long max)
{
    char *end, msg[300];
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        snprintf(msg, sizeof msg, "%s takes a whole number, not '%.200s'", what, s);
        ctl_die_usage("%s", msg);
    }
    if (v < min) {
        snprintf(msg, sizeof msg, "%s is at least %ld, not %ld", what, min, v);
        ctl_die_usage("%s", msg);
    }
    if (v > max) {
        snprintf(msg, sizeof msg, "%s is at most %ld, not %ld", what, max, v);
        ctl_die_usage("%s", msg);
    }
    return v;
}

/* The commands: each runs with its argument (NULL if none) once the
 * options are read and the connection is set up, and returns the exit
 * status. */
static int run_list(const char *arg)
{
    return O.redlock_nodes ? ctl_rl_list(arg ? arg : "*") : ctl_list(arg ? arg : "*");
}
static int run_show(const char *arg)
{
    return (O.redlock_nodes ? ctl_rl_show(arg, 0) : ctl_show(arg, 0)) ? 0 : 1;
}
static int run_release(const char *arg) { return O.client ? ctl_release_client() : ctl_release(arg); }
static int run_watch(const char *arg) { return ctl_watch(arg); }
static int run_doctor(const char *arg)
{
    (void)arg;
    return ctl_doctor();
}
static int run_seed_fresh(const char *arg)
{
    (void)arg;
    return ctl_seed_fresh();
}

typedef struct ctl_command {
    const char *name;
    int needs_name; /* a lock name must follow (release: or --client ID) */
    int (*run)(const char *arg);
} ctl_command;

static const ctl_command commands[] = {
    {"list", 0, run_list},       {"show", 1, run_show},     {"release", 1, run_release},
    {"watch", 1, run_watch},     {"doctor", 0, run_doctor},
    {"seed-fresh", 0, run_seed_fresh},
};

int main(int argc, char **argv)
{
    enum { O_CLUSTER = 256, O_SENTINELS, O_MASTER, O_SPW, O_JSON, O_FORCE, O_INTERVAL, O_COUNT,
           O_HELP, O_CLIENT, O_VERSION, O_PREFIX, O_REDLOCK };
    static const struct option lo[] = {
        {"host", required_argument, 0, 'h'},       {"socket", required_argument, 0, 's'},
        {"user", required_argument, 0, 'u'},       {"password", required_argument, 0, 'a'},
        {"db", required_argument, 0, 'n'},         {"prefix", required_argument, 0, O_PREFIX},
        {"port", required_argument, 0, 'p'},
        {"cluster", required_argument, 0, O_CLUSTER},
        {"sentinels", required_argument, 0, O_SENTINELS},
        {"master", required_argument, 0, O_MASTER},
        {"sentinel-password", required_argument, 0, O_SPW},
        {"redlock-nodes", required_argument, 0, O_REDLOCK},
        {"json", no_argument, 0, O_JSON},          {"force", no_argument, 0, O_FORCE},
        {"interval", required_argument, 0, O_INTERVAL},
        {"count", required_argument, 0, O_COUNT},  {"help", no_argument, 0, O_HELP},
        {"client", required_argument, 0, O_CLIENT},
        {"version", no_argument, 0, O_VERSION},
        {0, 0, 0, 0}};
    O.password = getenv("DLOCK_PASSWORD");
    int opt, where = 0, port = 0, host_port = 0;
    while ((opt = getopt_long(argc, argv, "+h:p:s:u:a:n:", lo, NULL)) != -1) {
        switch (opt) {
        case 'h': {
            /* HOST, HOST:PORT, an IPv6 address alone (more than one colon),
             * or [IPv6] and [IPv6]:PORT */
            const char *host = optarg, *colon = strrchr(optarg, ':');
            size_t len = strlen(optarg);
            if (optarg[0] == '[') {
                const char *end = strchr(optarg, ']');
                if (!end || end == optarg + 1 || (end[1] && end[1] != ':'))
                    ctl_die_usage("--host wants HOST, HOST:PORT or [IPV6]:PORT, not '%s'",
                                  optarg);
                host = optarg + 1;
                len = (size_t)(end - host);
                colon = end[1] ? end + 1 : NULL;
            } else if (colon && strchr(optarg, ':') != colon) {
                colon = NULL; /* a bare IPv6 address */
            } else if (colon) {
                len = (size_t)(colon - optarg);
            }
            if (len == 0 || (colon && !colon[1]) || len >= sizeof O.host)
                ctl_die_usage("--host wants HOST, HOST:PORT or [IPV6]:PORT, not '%s'", optarg);
            snprintf(O.host, sizeof O.host, "%.*s", (int)len, host);
            if (colon) {
                O.port = (int)number(colon + 1, "--host's port", 1, 65535);
                host_port = 1;
            }
            where++;
            break;
        }
        case 'p': port = (int)number(optarg, "--port", 1, 65535); break;
        case O_PREFIX: O.prefix = optarg; break;
        case 's': O.unix_path = optarg; where++; break;
        case 'u': O.user = optarg; break;
        case 'a': O.password = optarg; break;
        case 'n': O.db = (int)number(optarg, "--db", 0, 1 << 20); break;
        case O_CLUSTER: O.cluster = optarg; where++; break;
        case O_SENTINELS: O.sentinels = optarg; where++; break;
        case O_MASTER: O.master = optarg; break;
        case O_REDLOCK: O.redlock_nodes = optarg; where++; break;
        case O_SPW: O.sentinel_password = optarg; break;
        case O_JSON: O.json = 1; break;
        case O_FORCE: O.force = 1; break;
        case O_INTERVAL: O.interval_ms = number(optarg, "--interval", 10, 86400000); break;
        case O_COUNT: O.count = number(optarg, "--count", 1, 1L << 40); break;
        case O_CLIENT: O.client = optarg; break;
        case O_VERSION: {
            char reads[32];
            printf("dlockctl %s (protocol %d, reads %s)\n", dlock_version(),
                   DLOCK_PROTOCOL_DEFAULT, ctl_protocols(reads, sizeof reads, ""));
            return 0;
        }
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (where > 1)
        ctl_die_usage("%s", "--host, --socket, --cluster, --sentinels and --redlock-nodes each "
                        "name the server: give one");
    if (port) {
        if (O.unix_path || O.cluster || O.sentinels || O.redlock_nodes)
            ctl_die_usage("%s", "--port goes with --host, not --socket, --cluster, --sentinels "
                          "or --redlock-nodes");
        if (host_port && O.port != port) {
            char msg[120];
            snprintf(msg, sizeof msg, "--host says port %d, --port %d: give one", O.port, port);
            ctl_die_usage("%s", msg);
        }
        O.port = port;
    }
    if (O.user && !O.password)
        ctl_die_usage("%s", "--user needs --password (or DLOCK_PASSWORD)");
    if (strlen(O.prefix) > DLOCK_PREFIX_MAX)
        ctl_die_usage("--prefix '%s' is longer than the library allows", O.prefix);
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *command = argv[optind++];
    /* options may also follow the command's arguments: release NAME --force */
    const char *arg = NULL;
    for (; optind < argc; optind++) {
        if (!strcmp(argv[optind], "--force"))
            O.force = 1;
        else if (!strcmp(argv[optind], "--json"))
            O.json = 1;
        else if (!strcmp(argv[optind], "--interval") && optind + 1 < argc)
            O.interval_ms = number(argv[++optind], "--interval", 10, 86400000);
        else if (!strcmp(argv[optind], "--count") && optind + 1 < argc)
            O.count = number(argv[++optind], "--count", 1, 1L << 40);
        else if (!strcmp(argv[optind], "--client") && optind + 1 < argc)
            O.client = argv[++optind];
        else if (!arg)
            arg = argv[optind];
        else
            ctl_die_usage("unexpected argument '%s'", argv[optind]);
    }
    const ctl_command *cmd = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(command, commands[i].name))
            cmd = &commands[i];
    if (!cmd)
        ctl_die_usage("unknown command '%s' (list, show, watch, release, doctor, seed-fresh)",
                      command);
    if (cmd->run == run_seed_fresh && !O.redlock_nodes)
        ctl_die_usage("%s", "seed-fresh needs --redlock-nodes LIST (the masters of the "
                      "Redlock deployment)");
    if (O.redlock_nodes && (cmd->run == run_release || cmd->run == run_doctor))
        ctl_die_usage("--redlock-nodes goes with list, show, watch and seed-fresh: %s works "
                      "on one node at a time (give it with --host)", command);
    if (cmd->run == run_seed_fresh && arg)
        ctl_die_usage("seed-fresh takes no argument ('%s')", arg);
    if (O.client && cmd->run != run_release)
        ctl_die_usage("--client goes with release, not %s", command);
    if (O.client && arg)
        ctl_die_usage("release takes a name or --client ID, not both ('%s')", arg);
    if (O.client && (strlen(O.client) != 32 || strspn(O.client, "0123456789abcdef") != 32))
        ctl_die_usage("--client wants a client id, 32 hex digits, not '%s'", O.client);
    if (cmd->needs_name && !O.client && (!arg || !*arg))
        ctl_die_usage("%s needs a lock name", command);
    if (arg && strlen(arg) > DLOCK_NAME_MAX)
        ctl_die_usage("the name is longer than %s bytes", "DLOCK_NAME_MAX");
    if (O.redlock_nodes)
        return cmd->run(arg); /* its own connections: the node set's */
    ctl_setup();
    int rc = cmd->run(arg);
    ctl_teardown();
    return rc;
}

