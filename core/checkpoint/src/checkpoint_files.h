// What the checkpoint sources share: file names, durable writes, checked reads (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ampkit/checkpoint.h"

namespace torch::optim {
class Optimizer;
}

namespace ampkit::checkpoint_files {

inline constexpr const char* kModelFile = "model.pt";
inline constexpr const char* kOptimizerFile = "optimizer.pt";
inline constexpr const char* kOptimizerStateDictFile = "optimizer_state_dict.pt";
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kManifestSumFile = "manifest.sha256";

// Throws Error(checkpoint) with the message.
[[noreturn]] void fail(const std::string& message);
std::string errno_text();
std::string sha256_of(const void* data, size_t size);

// Writes the whole buffer and fsyncs it before returning: after this the bytes are on disk.
void write_durable(const std::filesystem::path& file, const void* data, size_t size);
void write_durable(const std::filesystem::path& file, const std::string& text);
// A rename or a new entry is durable only once its folder is fsynced.
void fsync_folder(const std::filesystem::path& folder);
void rename_or_fail(const std::filesystem::path& from, const std::filesystem::path& to);
// A whole regular file, or nullopt when it does not exist; fail() for anything else that is there
// (a FIFO, a device, a folder, an unreadable file) and for a file over max_bytes.
std::optional<std::vector<char>> read_bytes(const std::filesystem::path& file, uint64_t max_bytes);

// "step-<digits>" -> N, anything else -> -1.
int64_t step_of(const std::string& name);
bool is_hex_digest(const std::string& s);

// The optimizer's state as torch::serialize::OutputArchive writes it (optimizer.pt, snapshots).
std::string optimizer_bytes(torch::optim::Optimizer& optimizer);

// manifest.json without its "files" entry (manifest.cpp).
nlohmann::json manifest_to_json(const CheckpointManifest& m);
CheckpointManifest manifest_from_json(const nlohmann::json& j);

}  // namespace ampkit::checkpoint_files
