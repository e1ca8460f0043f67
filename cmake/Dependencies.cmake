# Third-party libraries, all from Debian packages (scripts/setup.sh installs them by name).
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenMP REQUIRED)

# PCRE2 (8-bit, with JIT) for the pre-tokenizer regexes. pkg-config where it exists; otherwise a
# header plus the runtime library (the GPU machine has libpcre2-8.so.0 but no -dev package).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
add_library(splitflow::pcre2 INTERFACE IMPORTED)
if(PCRE2_FOUND)
  target_link_libraries(splitflow::pcre2 INTERFACE PkgConfig::PCRE2)
else()
  find_path(PCRE2_INCLUDE_DIR pcre2.h HINTS ${SPLITFLOW_EXTRA_INCLUDE})
  find_library(PCRE2_LIBRARY NAMES pcre2-8 libpcre2-8.so.0)
  if(NOT PCRE2_INCLUDE_DIR OR NOT PCRE2_LIBRARY)
    message(FATAL_ERROR "PCRE2 not found: install libpcre2-dev (scripts/setup.sh does)")
  endif()
  target_include_directories(splitflow::pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
  target_link_libraries(splitflow::pcre2 INTERFACE ${PCRE2_LIBRARY})
endif()
target_compile_definitions(splitflow::pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)

# xxHash (XXH3) for the prefix cache's block keys, used header-only (XXH_INLINE_ALL): no library to
# link, so a machine with only the header builds too.
find_path(XXHASH_INCLUDE_DIR xxhash.h HINTS ${SPLITFLOW_EXTRA_INCLUDE})
if(NOT XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "xxhash.h not found: install libxxhash-dev (scripts/setup.sh does)")
endif()
add_library(splitflow::xxhash INTERFACE IMPORTED)
target_include_directories(splitflow::xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
