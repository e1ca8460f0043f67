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

# cpp-httplib for the HTTP server (server/http_server.cpp, `splitflow serve`). Two forms work:
#  - Debian's libcpp-httplib-dev: httplib.h holds declarations only and libcpp-httplib.so the code,
#    built with OpenSSL, zlib and brotli; its pkg-config Cflags (-DCPPHTTPLIB_OPENSSL_SUPPORT ...)
#    change class layouts, so every file that includes httplib.h must get them.
#  - upstream's header-only httplib.h, carried in SPLITFLOW_EXTRA_INCLUDE (machines without the
#    package, such as the GPU machine): compiled into the binary, no TLS. docs/serving.md says how
#    to obtain it from Debian's source package.
# Without either, the build goes on without the HTTP server and `splitflow serve`.
find_package(Threads REQUIRED)
add_library(splitflow::httplib INTERFACE IMPORTED)
set(SPLITFLOW_HAS_HTTPLIB OFF)
find_path(HTTPLIB_INCLUDE_DIR httplib.h HINTS ${SPLITFLOW_EXTRA_INCLUDE})
if(HTTPLIB_INCLUDE_DIR)
  file(STRINGS ${HTTPLIB_INCLUDE_DIR}/httplib.h HTTPLIB_SERVER_CTOR REGEX "^inline Server::Server\\(\\)")
  if(HTTPLIB_SERVER_CTOR)
    target_include_directories(splitflow::httplib INTERFACE ${HTTPLIB_INCLUDE_DIR})
    set(SPLITFLOW_HAS_HTTPLIB ON)
    message(STATUS "splitflow: header-only cpp-httplib from ${HTTPLIB_INCLUDE_DIR}")
  elseif(PkgConfig_FOUND)
    pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
    if(HTTPLIB_FOUND)
      target_link_libraries(splitflow::httplib INTERFACE PkgConfig::HTTPLIB)
      set(SPLITFLOW_HAS_HTTPLIB ON)
    endif()
  endif()
endif()
if(SPLITFLOW_HAS_HTTPLIB)
  target_link_libraries(splitflow::httplib INTERFACE Threads::Threads)
  target_compile_definitions(splitflow::httplib INTERFACE SPLITFLOW_HAS_HTTPLIB=1)
else()
  message(WARNING "cpp-httplib not found: building without the HTTP server and `splitflow serve` "
                  "(install libcpp-httplib-dev, or carry a header-only httplib.h in SPLITFLOW_EXTRA_INCLUDE)")
endif()
