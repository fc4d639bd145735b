// UTF-8 validity: JSON (metrics, summaries, checkpoint manifests) holds only UTF-8, so text that
// will end up there is checked where it enters: option values at start-up, plugin state at save.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ampkit {

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF included), or nothing when all is valid.
std::optional<size_t> invalid_utf8_at(const std::string& text);

}  // namespace ampkit
