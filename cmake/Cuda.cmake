# SPLITFLOW_CUDA=AUTO builds the CUDA backend when nvcc is found; ON requires it; OFF skips it.
# Targets Hopper (sm_90a SASS) plus compute_90 PTX so newer GPUs JIT the code.
set(SPLITFLOW_HAS_CUDA OFF)
if(NOT SPLITFLOW_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(SPLITFLOW_HAS_CUDA ON)
  elseif(SPLITFLOW_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SPLITFLOW_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

if(SPLITFLOW_HAS_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90a-real 90-virtual)
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc 13's C++20 flag; CUDA sources are C++17.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB_RECURSE SPLITFLOW_CUDA_SOURCES CONFIGURE_DEPENDS
       ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cpp)
  add_library(splitflow_cuda OBJECT ${SPLITFLOW_CUDA_SOURCES})
  target_include_directories(splitflow_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(splitflow_cuda PUBLIC CUDA::cudart CUDA::cublasLt fmt::fmt nlohmann_json::nlohmann_json)
  target_compile_options(splitflow_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  # quant/block_quantizers.h on the device must round as on the host (quant/ has -ffp-contract=off):
  # no fused multiply-adds in that file, on either side.
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/backend/cuda/quantize_matrix.cu PROPERTIES
                              COMPILE_OPTIONS "-fmad=false;-Xcompiler=-ffp-contract=off")
  message(STATUS "splitflow: CUDA backend ON (${CMAKE_CUDA_COMPILER}, archs ${CMAKE_CUDA_ARCHITECTURES})")

  # Collectives (src/comm/*.cu): NCCL and the custom CUDA-IPC allreduce, in a library of their own
  # so the backend's compile flags stay as they are. NCCL ships with the CUDA toolkit; elsewhere
  # -DSPLITFLOW_NCCL_ROOT names a folder with include/nccl.h and lib/libnccl.so*.
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${SPLITFLOW_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${SPLITFLOW_NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR})
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "NCCL not found (nccl.h, libnccl): pass -DSPLITFLOW_NCCL_ROOT=<folder with include/ and lib/>")
  endif()
  file(GLOB SPLITFLOW_COMM_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/comm/*.cu)
  # Object libraries: their objects go into splitflow_lib itself (CMakeLists.txt), since they call
  # back into it (core, comm's CPU half); separate static libraries would form a link cycle.
  add_library(splitflow_comm_cuda OBJECT ${SPLITFLOW_COMM_CUDA_SOURCES})
  target_include_directories(splitflow_comm_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_include_directories(splitflow_comm_cuda PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(splitflow_comm_cuda PUBLIC CUDA::cudart ${NCCL_LIBRARY} fmt::fmt ${CMAKE_DL_LIBS})
  target_compile_options(splitflow_comm_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  message(STATUS "splitflow: comm with NCCL (${NCCL_LIBRARY})")
else()
  message(STATUS "splitflow: CUDA backend OFF")
endif()
