# Writes OUT, a C file defining one NUL-terminated string per Lua script:
#   const char dlock_lua_<name>[] = { ... };
# Bytes are written as hex so any script text embeds verbatim.
set(body "/* Generated from the lua/ scripts by cmake/embed_lua.cmake. Do not edit. */\n")
foreach(name ${NAMES})
  file(READ ${DIR}/${name}.lua hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(APPEND body "const char dlock_lua_${name}[] = {${hex}0x00};\n")
endforeach()
file(WRITE ${OUT}.tmp "${body}")
file(RENAME ${OUT}.tmp ${OUT})
