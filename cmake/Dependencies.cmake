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

# Boost.Beast on Boost.Asio (header-only, Debian's libboost-dev) for the HTTP front (http/,
# server/http_server.cpp, `splitflow serve`). The GPU machine has no Boost: carry the headers the
# front includes (scripts/carry_boost.sh) in SPLITFLOW_EXTRA_INCLUDE. Without them the build goes
# on without the HTTP server.
find_package(Threads REQUIRED)
add_library(splitflow::beast INTERFACE IMPORTED)
set(SPLITFLOW_HAS_BEAST OFF)
find_path(BOOST_BEAST_INCLUDE_DIR boost/beast.hpp HINTS ${SPLITFLOW_EXTRA_INCLUDE})
if(BOOST_BEAST_INCLUDE_DIR)
  target_include_directories(splitflow::beast SYSTEM INTERFACE ${BOOST_BEAST_INCLUDE_DIR})
  target_link_libraries(splitflow::beast INTERFACE Threads::Threads)
  # Boost.System's error categories header-only, and no deprecated Asio names.
  target_compile_definitions(splitflow::beast INTERFACE BOOST_ERROR_CODE_HEADER_ONLY BOOST_ASIO_NO_DEPRECATED)
  set(SPLITFLOW_HAS_BEAST ON)
else()
  message(WARNING "Boost.Beast not found: building without the HTTP server and `splitflow serve` "
                  "(install libboost-dev, or carry the headers in SPLITFLOW_EXTRA_INCLUDE: scripts/carry_boost.sh)")
endif()

# cpp-httplib: only as an HTTP client (`splitflow bench serve`, the server tests). Two forms work:
#  - Debian's libcpp-httplib-dev: httplib.h holds declarations only and libcpp-httplib.so the code,
#    built with OpenSSL, zlib and brotli; its pkg-config Cflags (-DCPPHTTPLIB_OPENSSL_SUPPORT ...)
#    change class layouts, so every file that includes httplib.h must get them.
#  - upstream's header-only httplib.h, carried in SPLITFLOW_EXTRA_INCLUDE (the GPU machine).
add_library(splitflow::httplib INTERFACE IMPORTED)
set(SPLITFLOW_HAS_HTTPLIB OFF)
find_path(HTTPLIB_INCLUDE_DIR httplib.h HINTS ${SPLITFLOW_EXTRA_INCLUDE})
if(HTTPLIB_INCLUDE_DIR)
  file(STRINGS ${HTTPLIB_INCLUDE_DIR}/httplib.h HTTPLIB_SERVER_CTOR REGEX "^inline Server::Server\\(\\)")
  if(HTTPLIB_SERVER_CTOR)
    target_include_directories(splitflow::httplib INTERFACE ${HTTPLIB_INCLUDE_DIR})
    set(SPLITFLOW_HAS_HTTPLIB ON)
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
  message(WARNING "cpp-httplib not found: building without `splitflow bench serve` and the HTTP server tests")
endif()
