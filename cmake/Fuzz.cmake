# Sanitizer and fuzzing builds (docs/fuzzing.md).
#  - SPLITFLOW_SANITIZE=address,undefined (any -fsanitize= list; gcc or clang) instruments every
#    target, for a sanitizer run of the normal tests in a build dir of its own.
#  - SPLITFLOW_FUZZ=ON (clang only; CC=clang CXX=clang++, a build dir of its own such as
#    build-fuzz, which scripts/fuzz.sh configures) instruments the code for libFuzzer
#    (-fsanitize=fuzzer-no-link,address,undefined) and builds the harnesses under fuzz/ as fuzz_<name>
#    (-fsanitize=fuzzer,address,undefined).
#  - Otherwise (the normal build, tests on) each harness is built with fuzz/replay_main.cpp as
#    fuzz_replay_<name> and replays its seed corpus and crash reproducers as the ctest test
#    fuzz_<name> (label `fuzz`).
option(SPLITFLOW_FUZZ "Build the libFuzzer harnesses under fuzz/ (clang; a build dir of its own)" OFF)
set(SPLITFLOW_SANITIZE "" CACHE STRING "Sanitizers for every target, e.g. address,undefined (empty: none)")

# A sanitizer report must fail the run, not scroll past: nothing recovers.
if(SPLITFLOW_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${SPLITFLOW_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${SPLITFLOW_SANITIZE})
endif()

if(SPLITFLOW_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SPLITFLOW_FUZZ needs clang (configure with CC=clang CXX=clang++), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()

add_subdirectory(${CMAKE_SOURCE_DIR}/fuzz)
