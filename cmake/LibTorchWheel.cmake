# Finds LibTorch inside the pip `torch` wheel and defines imported targets:
#   ampkit::torch_cpu  c10 + torch_cpu (what plugins and most code need)
#   ampkit::torch      the above plus torch and, with CUDA, torch_cuda/c10_cuda (for executables)
# Installed with ampkit's CMake package, whose ampkitConfig.cmake includes it the same way.
# Where torch is: -DAMPKIT_TORCH_DIR=<site-packages/torch> (or the environment variable of that
# name) overrides; otherwise python (Python3_EXECUTABLE, else the first python3 found) is asked.
if(NOT AMPKIT_TORCH_DIR AND DEFINED ENV{AMPKIT_TORCH_DIR})
  set(AMPKIT_TORCH_DIR "$ENV{AMPKIT_TORCH_DIR}")
endif()
if(AMPKIT_TORCH_DIR AND NOT AMPKIT_TORCH_VERSION)
  set(_header "${AMPKIT_TORCH_DIR}/include/torch/headeronly/version.h")
  if(NOT EXISTS "${_header}")
    message(FATAL_ERROR "ampkit: AMPKIT_TORCH_DIR=${AMPKIT_TORCH_DIR} is not a torch package folder (no ${_header})")
  endif()
  file(STRINGS "${_header}" _lines REGEX "^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
  set(_ver "")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _n "${_line}")
    list(APPEND _ver "${_n}")
  endforeach()
  list(JOIN _ver "." _ver)
  set(AMPKIT_TORCH_VERSION "${_ver}" CACHE STRING "LibTorch version")
  # The pip wheels have used the C++11 ABI since torch 2.7; set this for an older build.
  set(AMPKIT_TORCH_CXX11_ABI 1 CACHE STRING "LibTorch _GLIBCXX_USE_CXX11_ABI")
elseif(NOT AMPKIT_TORCH_DIR)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _ampkit_torch_out RESULT_VARIABLE _ampkit_torch_rc ERROR_QUIET
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _ampkit_torch_rc EQUAL 0)
    message(FATAL_ERROR "ampkit: python torch not found by ${Python3_EXECUTABLE}; run tools/setup.sh, "
      "or point -DPython3_EXECUTABLE or -DAMPKIT_TORCH_DIR at the torch to use")
  endif()
  string(REPLACE "\n" ";" _ampkit_torch_out "${_ampkit_torch_out}")
  list(GET _ampkit_torch_out 0 _dir)
  list(GET _ampkit_torch_out 1 _ver)
  list(GET _ampkit_torch_out 2 _abi)
  set(AMPKIT_TORCH_DIR "${_dir}" CACHE PATH "torch package folder (site-packages/torch)")
  set(AMPKIT_TORCH_VERSION "${_ver}" CACHE STRING "LibTorch version")
  set(AMPKIT_TORCH_CXX11_ABI "${_abi}" CACHE STRING "LibTorch _GLIBCXX_USE_CXX11_ABI")
endif()
if(NOT AMPKIT_TORCH_VERSION STREQUAL "2.11.0")
  message(WARNING "ampkit is pinned to torch 2.11.0 (the GPU machine's); found ${AMPKIT_TORCH_VERSION}")
endif()
set(AMPKIT_TORCH_LIB_DIR "${AMPKIT_TORCH_DIR}/lib")
if(TARGET ampkit::torch_cpu)  # a second find_package(ampkit) in the same folder
  return()
endif()

# Headers and ABI flags only: for code that declares torch types but calls nothing in torch
# (the registry behind ampkit-plugins, which then starts without loading libtorch).
add_library(ampkit::torch_headers INTERFACE IMPORTED)
target_include_directories(ampkit::torch_headers SYSTEM INTERFACE
  "${AMPKIT_TORCH_DIR}/include" "${AMPKIT_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(ampkit::torch_headers INTERFACE _GLIBCXX_USE_CXX11_ABI=${AMPKIT_TORCH_CXX11_ABI}
  USE_C10D_GLOO USE_DISTRIBUTED USE_RPC USE_TENSORPIPE)

add_library(ampkit::torch_cpu INTERFACE IMPORTED)
target_link_libraries(ampkit::torch_cpu INTERFACE ampkit::torch_headers
  "${AMPKIT_TORCH_LIB_DIR}/libtorch_cpu.so" "${AMPKIT_TORCH_LIB_DIR}/libc10.so")

set(AMPKIT_HAS_CUDA OFF)
if(EXISTS "${AMPKIT_TORCH_LIB_DIR}/libtorch_cuda.so" AND NOT AMPKIT_WITH_CUDA STREQUAL "OFF")
  set(AMPKIT_HAS_CUDA ON)
elseif(AMPKIT_WITH_CUDA STREQUAL "ON")
  message(FATAL_ERROR "AMPKIT_WITH_CUDA=ON but ${AMPKIT_TORCH_LIB_DIR} has no libtorch_cuda.so")
endif()

add_library(ampkit::torch INTERFACE IMPORTED)
target_link_libraries(ampkit::torch INTERFACE ampkit::torch_cpu "${AMPKIT_TORCH_LIB_DIR}/libtorch.so")
if(AMPKIT_HAS_CUDA)
  # Nothing references torch_cuda directly; without --no-as-needed the linker would drop it and
  # CUDA kernels would not be registered at run time.
  target_link_libraries(ampkit::torch INTERFACE
    "-Wl,--no-as-needed,${AMPKIT_TORCH_LIB_DIR}/libtorch_cuda.so,${AMPKIT_TORCH_LIB_DIR}/libc10_cuda.so,--as-needed")
  target_compile_definitions(ampkit::torch INTERFACE AMPKIT_HAS_CUDA=1)
endif()
# Executables find torch where setup installed it; on another machine set LD_LIBRARY_PATH.
# A project using the installed package keeps any run path it chose itself.
if(NOT CMAKE_BUILD_RPATH)
  set(CMAKE_BUILD_RPATH "${AMPKIT_TORCH_LIB_DIR}")
endif()
if(NOT CMAKE_INSTALL_RPATH)
  set(CMAKE_INSTALL_RPATH "${AMPKIT_TORCH_LIB_DIR}")
endif()
message(STATUS "ampkit: torch ${AMPKIT_TORCH_VERSION} at ${AMPKIT_TORCH_DIR} (CUDA libraries: ${AMPKIT_HAS_CUDA})")
