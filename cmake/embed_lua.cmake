# Writes OUT, a C file defining one NUL-terminated string per Lua script:
#   const char dlock_lua_<name>[] = { ... };
# where a script in a folder (p2/acquire) is named with '_' for '/'
# (dlock_lua_p2_acquire).
# Bytes are written as hex so any script text embeds verbatim.
set(body "/* Generated from the lua/ scripts by cmake/embed_lua.cmake. Do not edit. */\n")
foreach(name ${NAMES})
  file(READ ${DIR}/${name}.lua hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(REPLACE "/" "_" sym "${name}")
  string(APPEND body "const char dlock_lua_${sym}[] = {${hex}0x00};\n")
endforeach()
file(WRITE ${OUT}.tmp "${body}")
file(RENAME ${OUT}.tmp ${OUT})

# And KEYS_OUT, from lua/keys.lua (the keys of one lock name, in the order
# the scripts take them): DLOCK_KEY_<NAME> in that order, DLOCK_KEYS, and
# DLOCK_KEY_SUFFIXES, the suffixes as a C initializer.
file(STRINGS ${DIR}/keys.lua rows REGEX "^  {'[A-Z]+', '[^']*'},")
set(enum "")
set(suffixes "")
foreach(row ${rows})
  string(REGEX REPLACE "^  {'([A-Z]+)', '([^']*)'},.*" "\\1" key "${row}")
  string(REGEX REPLACE "^  {'([A-Z]+)', '([^']*)'},.*" "\\2" suffix "${row}")
  string(APPEND enum "    DLOCK_KEY_${key},\n")
  string(APPEND suffixes " \"${suffix}\",")
endforeach()
list(LENGTH rows n)
if(NOT n EQUAL 7)
  message(FATAL_ERROR "lua/keys.lua: ${n} keys read, the scripts take 7")
endif()
set(h "/* Generated from lua/keys.lua by cmake/embed_lua.cmake. Do not edit. */\n")
string(APPEND h "#ifndef DLOCK_KEYS_GEN_H\n#define DLOCK_KEYS_GEN_H\n")
string(APPEND h "enum {\n${enum}    DLOCK_KEYS\n};\n")
string(APPEND h "#define DLOCK_KEY_SUFFIXES {${suffixes} }\n#endif\n")
file(WRITE ${KEYS_OUT}.tmp "${h}")
file(RENAME ${KEYS_OUT}.tmp ${KEYS_OUT})
