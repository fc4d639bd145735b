// The command-line selector of a plugin kind in ampkit's programs (--scaler, --clipper,
// --nan-policy, --comm, --fp8): the kind's name with '-' for '_', but an fp8 recipe is chosen by
// naming the fp8 mode's recipe. A program's word, not the SDK's.
#pragma once

#include <ampkit/kinds.h>

#include <string>

namespace ampkit {

// "nan-policy" for nan_policy: the selector without its "--".
inline std::string kind_flag(const KindInfo& kind) {
  if (std::string(kind.name) == "fp8_recipe") return "fp8";
  std::string flag = kind.name;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

}  // namespace ampkit
