// Versions of the ampkit SDK and the plugin ABI, and what a plugin records about its build.
#pragma once

#include <cstddef>  // defines _GLIBCXX_USE_CXX11_ABI

#define AMPKIT_VERSION_MAJOR 0
#define AMPKIT_VERSION_MINOR 1
#define AMPKIT_VERSION_PATCH 0
#define AMPKIT_VERSION_STRING "0.1.0"

// Bumped whenever ampkit_plugin_descriptor, an interface in this SDK, or a type crossing the
// plugin boundary changes layout or meaning. The host refuses plugins with another value.
#ifdef AMPKIT_ABI_VERSION_OVERRIDE  // for the loader's own tests only
#define AMPKIT_ABI_VERSION AMPKIT_ABI_VERSION_OVERRIDE
#else
// 2: NanDecision::skip_batches and NanPolicy::rollback_plan() (the rollback NaN policy).
// 3: the layout record (section "ampkitly"), per-kind headers, the alias without Boost.DLL,
//    AMPKIT_PLUGIN(kind, name, Class, summary, options...) checked against ampkit_add_plugin.
// 4: NanAction::clip and NanDecision::clip_norm (a finite spike applied with its norm clipped).
// 5: Strategy::find_function (optional functions by name, so the next capability needs no bump),
//    CommBackend::all_gather, CommFailure from explain_failure, the comm facts (CommFact).
#define AMPKIT_ABI_VERSION 5
#endif

#define AMPKIT_STRINGIFY_(x) #x
#define AMPKIT_STRINGIFY(x) AMPKIT_STRINGIFY_(x)

// The LibTorch version a plugin is compiled against; the host refuses a plugin built for another.
// AMPKIT_TORCH_VERSION_OVERRIDE exists for the loader's own tests (a plugin "built for" another torch).
#ifdef AMPKIT_TORCH_VERSION_OVERRIDE
#define AMPKIT_TORCH_VERSION AMPKIT_TORCH_VERSION_OVERRIDE
#else
#include <torch/headeronly/version.h>
#define AMPKIT_TORCH_VERSION            \
  AMPKIT_STRINGIFY(TORCH_VERSION_MAJOR) \
  "." AMPKIT_STRINGIFY(TORCH_VERSION_MINOR) "." AMPKIT_STRINGIFY(TORCH_VERSION_PATCH)
#endif

#if defined(__clang__)
#define AMPKIT_COMPILER "clang " AMPKIT_STRINGIFY(__clang_major__) "." AMPKIT_STRINGIFY(__clang_minor__)
#elif defined(__GNUC__)
#define AMPKIT_COMPILER "gcc " AMPKIT_STRINGIFY(__GNUC__) "." AMPKIT_STRINGIFY(__GNUC_MINOR__)
#else
#define AMPKIT_COMPILER "unknown"
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define AMPKIT_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define AMPKIT_CXX11_ABI 1
#endif
