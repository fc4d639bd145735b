# ampkit_read_kinds(<header> <out-var> <tensor-kinds-out-var>)
# The plugin kinds from their one declaration, the kKinds table of ampkit/kinds.h, and those whose
# interface passes tensors: ampkit's build reads them here, and the installed ampkitConfig.cmake
# carries the lists it read (AMPKIT_KINDS, AMPKIT_TENSOR_KINDS).
function(ampkit_read_kinds header out tensor_out)
  file(STRINGS "${header}" _lines REGEX "^ *\\{\"[a-z][a-z0-9_]*\", \"[^\"]+\", (true|false)\\},")
  set(_kinds "")
  set(_tensor_kinds "")
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "\\{\"([a-z][a-z0-9_]*)\".*, (true|false)\\}" _match "${_line}")
    if(NOT _match)
      message(FATAL_ERROR "ampkit_read_kinds: cannot read '${_line}' in ${header}")
    endif()
    list(APPEND _kinds "${CMAKE_MATCH_1}")
    if(CMAKE_MATCH_2 STREQUAL "true")
      list(APPEND _tensor_kinds "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  list(LENGTH _kinds _count)
  if(_count LESS 1)
    message(FATAL_ERROR "ampkit_read_kinds: no kinds found in ${header}")
  endif()
  set(${out} "${_kinds}" PARENT_SCOPE)
  set(${tensor_out} "${_tensor_kinds}" PARENT_SCOPE)
endfunction()

# ampkit_add_plugin(<target> KIND <kind> NAME <name> SOURCES <src>... [VERSION <v>] [OUTPUT_DIR <dir>]
#                   [COMPILE_DEFINITIONS <def>...] [LINK_TORCH])
# Plugins of kinds whose interface passes tensors (clipper, comm) link LibTorch's CPU libraries;
# the others (scaler, nan_policy) compile against the SDK's headers alone and link no torch
# library unless LINK_TORCH says they call into torch themselves.
# Builds libampkit-<kind>-<name>.so: a MODULE with hidden visibility against the SDK and LibTorch
# (whose _GLIBCXX_USE_CXX11_ABI comes with ampkit::sdk). Built-in plugins and third-party plugins
# use this same function; docs/plugin-authoring.md walks through it.
function(ampkit_add_plugin target)
  cmake_parse_arguments(P "LINK_TORCH" "KIND;NAME;VERSION;OUTPUT_DIR" "SOURCES;COMPILE_DEFINITIONS" ${ARGN})
  if(NOT AMPKIT_KINDS)
    message(FATAL_ERROR "ampkit_add_plugin(${target}): AMPKIT_KINDS is not set; use find_package(ampkit)")
  endif()
  if(NOT P_KIND IN_LIST AMPKIT_KINDS)
    string(REPLACE ";" ", " _kinds "${AMPKIT_KINDS}")
    message(FATAL_ERROR "ampkit_add_plugin(${target}): KIND must be one of ${_kinds}, got '${P_KIND}'")
  endif()
  if(NOT P_NAME MATCHES "^[a-z][a-z0-9_]*$")
    message(FATAL_ERROR "ampkit_add_plugin(${target}): NAME must be lower_snake_case, got '${P_NAME}'")
  endif()
  if(NOT P_SOURCES)
    message(FATAL_ERROR "ampkit_add_plugin(${target}): SOURCES is empty")
  endif()
  if(NOT P_VERSION)
    set(P_VERSION "${PROJECT_VERSION}")
  endif()
  if(NOT P_VERSION)
    message(FATAL_ERROR "ampkit_add_plugin(${target}): give VERSION or a project(... VERSION x.y.z)")
  endif()
  if(NOT P_OUTPUT_DIR)
    if(AMPKIT_PLUGIN_OUTPUT_DIR)
      set(P_OUTPUT_DIR "${AMPKIT_PLUGIN_OUTPUT_DIR}")
    else()
      set(P_OUTPUT_DIR "${CMAKE_CURRENT_BINARY_DIR}")
    endif()
  endif()
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE ampkit::sdk)
  if(P_LINK_TORCH OR P_KIND IN_LIST AMPKIT_TENSOR_KINDS)
    target_link_libraries(${target} PRIVATE ampkit::torch_cpu)
  endif()
  # AMPKIT_PLUGIN(kind, name, ...) static_asserts that it says the same as KIND and NAME here.
  target_compile_definitions(${target} PRIVATE AMPKIT_PLUGIN_VERSION="${P_VERSION}"
    AMPKIT_BUILD_KIND="${P_KIND}" AMPKIT_BUILD_NAME="${P_NAME}" ${P_COMPILE_DEFINITIONS})
  # --as-needed: a plugin that calls nothing in torch (most scalers and NaN policies) records no
  # dependency on libtorch_cpu/libc10. --no-undefined: a missing symbol fails the build, not the load.
  target_link_options(${target} PRIVATE "LINKER:--as-needed" "LINKER:--no-undefined")
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME "ampkit-${P_KIND}-${P_NAME}"
    LIBRARY_OUTPUT_DIRECTORY "${P_OUTPUT_DIR}"
    CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
    # The run path is the install one from the start: no relinking at install, and no padding
    # (CMake pads a build run path with an empty entry, which would search the current folder).
    BUILD_WITH_INSTALL_RPATH ON
    AMPKIT_PLUGIN_KIND "${P_KIND}" AMPKIT_PLUGIN_NAME "${P_NAME}")
  set_property(GLOBAL APPEND PROPERTY AMPKIT_PLUGIN_TARGETS ${target})
endfunction()

# ampkit_link_static_plugins(<executable> <plugin-target>...)
# Links plugins made by ampkit_add_plugin into <executable> (their object files, compiled once for
# the .so) and registers them before main() with ampkit::register_static_plugin. The program then
# selects them by the same names, needs no file for them at run time, and still loads plugin
# files beside them; a linked-in plugin wins over a file of the same kind and name.
function(ampkit_link_static_plugins executable)
  set(_declarations "")
  set(_registrations "")
  foreach(_plugin IN LISTS ARGN)
    get_target_property(_kind ${_plugin} AMPKIT_PLUGIN_KIND)
    get_target_property(_name ${_plugin} AMPKIT_PLUGIN_NAME)
    if(NOT _kind OR NOT _name)
      message(FATAL_ERROR "ampkit_link_static_plugins(${executable}): ${_plugin} is not from ampkit_add_plugin")
    endif()
    string(APPEND _declarations "extern \"C\" const void* AMPKIT_PLUGIN_ENTRY_NAME(${_kind}, ${_name});\n")
    string(APPEND _registrations
      "  add(AMPKIT_PLUGIN_ENTRY_NAME(${_kind}, ${_name}), \"${_kind} '${_name}'\");\n")
    get_target_property(_libs ${_plugin} LINK_LIBRARIES)
    target_sources(${executable} PRIVATE $<TARGET_OBJECTS:${_plugin}>)
    target_link_libraries(${executable} PRIVATE ${_libs})
  endforeach()
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/${executable}_static_plugins.cpp")
  # The entry of each plugin is the alias AMPKIT_PLUGIN() defines with C linkage; the ABI number
  # in its name comes from the same headers, so it cannot disagree with the plugins.
  file(CONFIGURE OUTPUT "${_file}" @ONLY CONTENT [=[
// Generated by ampkit_link_static_plugins(): registers the plugins linked into this program.
#include <ampkit/plugin.h>
#include <ampkit/registry.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

@_declarations@
namespace {

void add(const void* entry, const char* what) {
  if (entry == nullptr) {  // the alias is constant-initialised; null means a broken build
    std::fprintf(stderr, "ampkit: linked-in plugin %s has no entry\n", what);
    std::abort();
  }
  const auto fn = reinterpret_cast<ampkit_entry_fn>(reinterpret_cast<std::intptr_t>(entry));
  ampkit::register_static_plugin(fn());
}

[[maybe_unused]] const bool registered = [] {
@_registrations@  return true;
}();

}  // namespace
]=])
  target_sources(${executable} PRIVATE "${_file}")
  target_link_libraries(${executable} PRIVATE ampkit::ampkit)
endfunction()
