/* Error names and messages, generated from DLOCK_ERRNO_MAP in dlock.h. */
#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"
#include "dlock.h"

static __thread char last_error[512];

const char *dlock_strerror(int code)
{
    switch (code) {
    case DLOCK_OK:
        return "success";
#define XX(name, val, msg) \
    case DLOCK_##name:     \
        return msg;
        DLOCK_ERRNO_MAP(XX)
#undef XX
    default:
        return "unknown error";
    }
}

const char *dlock_err_name(int code)
{
    switch (code) {
    case DLOCK_OK:
        return "DLOCK_OK";
#define XX(name, val, msg) \
    case DLOCK_##name:     \
        return "DLOCK_" #name;
        DLOCK_ERRNO_MAP(XX)
#undef XX
    default:
        return "DLOCK_UNKNOWN";
    }
}

const char *dlock_last_error(void)
{
    return last_error;
}

void dlock_err_clear(void)
{
    last_error[0] = '\0';
}

int dlock_err_set(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *dlock_version(void)
{
    return DLOCK_VERSION_STRING;
}
