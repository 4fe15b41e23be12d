/*
 * clockshim: a preload library that lets Debian's redis-server run under
 * libfaketime, so that a test can step the server's wall clock (and only
 * its wall clock) forward and back while it runs.
 *
 * Why it exists. Debian's redis-server links the system jemalloc
 * (libjemalloc.so.2, unprefixed: redis calls plain malloc/free/realloc/
 * calloc/malloc_usable_size, plus mallctl, malloc_stats_print and nallocx;
 * it does not call mallocx/rallocx/dallocx). Under a plain
 * LD_PRELOAD=libfaketime the server hangs at startup: jemalloc calls
 * clock_gettime() while it holds its own lock (or while it initializes),
 * libfaketime initializes on that first call and allocates (dlsym, fopen of
 * the timestamp file, ...), the allocation re-enters jemalloc: deadlock, or
 * libfaketime's "Unexpected recursive calls to clock_gettime()".
 *
 * What it does.
 *  - It defines malloc, free, calloc, realloc, memalign, posix_memalign,
 *    aligned_alloc, valloc, pvalloc and malloc_usable_size, all forwarding
 *    to glibc's allocator (__libc_malloc etc.; malloc_usable_size is looked
 *    up in libc.so.6 itself). Preloaded first, these definitions win over
 *    jemalloc's for every object in the process, so redis, libfaketime,
 *    glibc, OpenSSL, Lua... all allocate from and free to glibc's heap: no
 *    pointer from one allocator ever reaches the other. jemalloc stays
 *    loaded but serves only what redis asks it directly: mallctl and
 *    malloc_stats_print (statistics of an allocator nobody uses: INFO's
 *    allocator_* fields and MEMORY MALLOC-STATS become meaningless) and
 *    nallocx (a size computation; redis 7.0 uses it in sdsResize only to
 *    skip a realloc when nallocx(newlen) == malloc_usable_size(old), which
 *    still guarantees the old block holds newlen bytes). C++ operator
 *    new/delete stay jemalloc's, as a consistent pair (redis is C).
 *  - It refuses to *create* libfaketime's POSIX semaphore (sem_open with
 *    O_CREAT of "/faketime_sem_*"). libfaketime 0.9.10 has no switch to
 *    turn its shared memory off (FAKETIME_DISABLE_SHM only exists from
 *    0.9.11) and treats a failing sem_open as "not supported": it then runs
 *    without shared memory, so a SIGKILLed server leaves no
 *    /dev/shm/faketime_* files behind (a stale pair with a reused pid makes
 *    the next libfaketime process exit with "shm_open failed: File
 *    exists"). Opening an existing one (inherited FAKETIME_SHARED) is
 *    forwarded unchanged. Every other sem_open is forwarded.
 *
 * Usage (the shim must come first in LD_PRELOAD, before libfaketime; use
 * the multi-threaded libfaketimeMT: redis has bio threads and jemalloc's
 * background thread, and libfaketime's file parsing is not thread-safe):
 *
 *   echo +0 > "$dir/faketime"          # offset of the wall clock, seconds
 *   env LD_PRELOAD="/path/to/libdlock_clockshim.so:/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1" \
 *       FAKETIME_TIMESTAMP_FILE="$dir/faketime" FAKETIME_NO_CACHE=1 \
 *       FAKETIME_DONT_FAKE_MONOTONIC=1 FAKETIME_DISABLE_SHM=1 NO_FAKE_STAT=1 \
 *       redis-server ...
 *
 * (unset FAKETIME, FAKETIME_SHARED and the other FAKETIME_* variables; FAKETIME
 * in the environment overrides the file.) Then step the server's clock by
 * replacing the file atomically (write a temporary file, rename it over):
 * "+5" = real time + 5 s, "-1.5" = real time - 1.5 s, "+0" = real time.
 * With FAKETIME_NO_CACHE=1 libfaketime re-reads the file on every
 * gettimeofday/time/clock_gettime(CLOCK_REALTIME), so the next call sees it
 * (FAKETIME_CACHE_DURATION is in whole seconds: no good for sub-second
 * steps). FAKETIME_DONT_FAKE_MONOTONIC=1 keeps CLOCK_MONOTONIC/_RAW/
 * _COARSE and CLOCK_BOOTTIME real, as in a real clock step. NO_FAKE_STAT=1
 * keeps file timestamps real.
 *
 * Limits.
 *  - The whole process runs on glibc malloc instead of jemalloc: memory
 *    use, fragmentation and allocator statistics differ from production;
 *    redis's used_memory stays consistent (it is counted with
 *    malloc_usable_size, which is glibc's here). Active defrag is not
 *    compiled into Debian's redis anyway.
 *  - glibc only (tested on Debian 12 x86_64: glibc 2.36, jemalloc 5.3.0,
 *    libfaketime 0.9.10, redis-server 7.0.15). Checked there: with the
 *    shim, no call reaches jemalloc's malloc/free/realloc/calloc/
 *    malloc_usable_size/mallocx/dallocx/operator new during startup, a
 *    mixed workload, BGSAVE/AOF rewrite (fork) and FLUSHALL ASYNC.
 *  - The shim must be first in LD_PRELOAD (its symbols must be found before
 *    jemalloc's); without it, libfaketime + jemalloc hang at startup.
 *  - Only for the redis-server process: never preload it into a sanitized
 *    binary (ASan/TSan replace malloc themselves). It is built without
 *    sanitizer flags for that reason.
 *  - With FAKETIME_NO_CACHE=1 every wall-clock read opens, reads and closes
 *    the timestamp file under a mutex with all signals blocked (about 6
 *    syscalls, a few per command): redis is ~25% slower; fine for tests.
 *  - If the timestamp file is missing, libfaketime falls back to
 *    $HOME/.faketimerc, then /etc/faketimerc, then "+0"; a FAKETIME
 *    variable in the environment wins over all of them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* glibc's own allocator, under names jemalloc does not define. */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t nmemb, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

#define SHIM_EXPORT __attribute__((visibility("default")))

SHIM_EXPORT void *malloc(size_t size)
{
    return __libc_malloc(size);
}

SHIM_EXPORT void free(void *ptr)
{
    __libc_free(ptr);
}

SHIM_EXPORT void *calloc(size_t nmemb, size_t size)
{
    return __libc_calloc(nmemb, size);
}

SHIM_EXPORT void *realloc(void *ptr, size_t size)
{
    return __libc_realloc(ptr, size);
}

SHIM_EXPORT void *memalign(size_t alignment, size_t size)
{
    return __libc_memalign(alignment, size);
}

SHIM_EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    return __libc_memalign(alignment, size);  /* glibc's aligned_alloc is memalign */
}

SHIM_EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size)
{
    if (alignment == 0 || alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    int saved = errno;
    void *p = __libc_memalign(alignment, size);
    errno = saved;
    if (p == NULL)
        return ENOMEM;
    *memptr = p;
    return 0;
}

SHIM_EXPORT void *valloc(size_t size)
{
    return __libc_valloc(size);
}

SHIM_EXPORT void *pvalloc(size_t size)
{
    return __libc_pvalloc(size);
}

/* glibc exports no __libc_malloc_usable_size: take malloc_usable_size from
 * libc.so.6 itself (a handle's lookup scope is that object and its
 * dependencies, so jemalloc's definition is not found). */
typedef size_t (*usable_size_fn)(void *);
static usable_size_fn libc_usable_size;

static usable_size_fn resolve_usable_size(void)
{
    usable_size_fn f = __atomic_load_n(&libc_usable_size, __ATOMIC_ACQUIRE);
    if (f != NULL)
        return f;
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc != NULL) {
        f = (usable_size_fn)dlsym(libc, "malloc_usable_size");
        dlclose(libc);
    }
    if (f == NULL) {
        static const char msg[] = "clockshim: malloc_usable_size not found in libc.so.6\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        abort();
    }
    __atomic_store_n(&libc_usable_size, f, __ATOMIC_RELEASE);
    return f;
}

SHIM_EXPORT size_t malloc_usable_size(void *ptr)
{
    if (ptr == NULL)
        return 0;
    return resolve_usable_size()(ptr);
}

/* Resolve early, before the program has threads. */
__attribute__((constructor)) static void clockshim_init(void)
{
    (void)resolve_usable_size();
}

/* libfaketime 0.9.10 creates "/faketime_sem_<pid>" with O_CREAT|O_EXCL and
 * silently runs without shared memory if that fails. */
typedef sem_t *(*sem_open_fn)(const char *, int, ...);

SHIM_EXPORT sem_t *sem_open(const char *name, int oflag, ...)
{
    mode_t mode = 0;
    unsigned int value = 0;
    if (oflag & O_CREAT) {
        va_list ap;
        va_start(ap, oflag);
        mode = va_arg(ap, mode_t);
        value = va_arg(ap, unsigned int);
        va_end(ap);
        if (strncmp(name, "/faketime_sem_", 14) == 0) {
            errno = ENOSYS;
            return SEM_FAILED;
        }
    }
    sem_open_fn real = (sem_open_fn)dlsym(RTLD_NEXT, "sem_open");
    if (real == NULL) {
        errno = ENOSYS;
        return SEM_FAILED;
    }
    if (oflag & O_CREAT)
        return real(name, oflag, mode, value);
    return real(name, oflag);
}
