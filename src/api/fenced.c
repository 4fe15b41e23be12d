/*
 * The fenced store's script (lua/fenced.lua, compiled in by
 * cmake/embed_lua.cmake), for applications that keep the data a lock
 * protects in Redis: dlock.h, dlock_fenced_script. Nothing shared, no state.
 */
#include "dlock.h"

extern const char dlock_lua_fenced[];

const char *dlock_fenced_script(void)
{
    return dlock_lua_fenced;
}
