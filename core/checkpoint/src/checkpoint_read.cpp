// Reading checkpoint folders: every file checked against its checksum; which one to resume.
#include <cstdint>

#include "ampkit/error.h"
#include "checkpoint_files.h"

namespace fs = std::filesystem;

namespace ampkit {

using namespace checkpoint_files;

namespace {

// manifest.json lists settings, plugin states and one line per tensor: far below this.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 28;

// read_bytes with the checkpoint named in front of its refusals.
std::optional<std::vector<char>> read_in(const std::string& where, const fs::path& file, uint64_t max_bytes) {
  try {
    return read_bytes(file, max_bytes);
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
}

// manifest.sha256 must be '<sha256>  manifest.json' and match manifest.json; returns its bytes.
std::vector<char> checked_manifest_bytes(const fs::path& folder, const std::string& where) {
  const auto sum_bytes = read_in(where, folder / kManifestSumFile, 4096);
  if (!sum_bytes)
    fail(where + ": " + (folder / kManifestSumFile).string() + " is missing (incomplete checkpoint)");
  const std::string sum_text(sum_bytes->begin(), sum_bytes->end());
  const std::string expected_line_tail = std::string("  ") + kManifestFile + "\n";
  const std::string manifest_digest = sum_text.substr(0, 64);
  if (sum_text.size() != 64 + expected_line_tail.size() || !is_hex_digest(manifest_digest) ||
      sum_text.compare(64, std::string::npos, expected_line_tail) != 0)
    fail(where + ": " + (folder / kManifestSumFile).string() + " is corrupt (not '<sha256>  manifest.json')");
  auto manifest_bytes = read_in(where, folder / kManifestFile, kMaxManifestBytes);
  if (!manifest_bytes)
    fail(where + ": " + (folder / kManifestFile).string() + " is missing (incomplete checkpoint)");
  const std::string actual = sha256_of(manifest_bytes->data(), manifest_bytes->size());
  if (actual != manifest_digest)
    fail(where + ": checksum mismatch for " + (folder / kManifestFile).string() + ": SHA-256 " + actual +
         ", but " + (folder / kManifestSumFile).string() + " says " + manifest_digest +
         " (manifest.json or manifest.sha256 is corrupt)");
  return std::move(*manifest_bytes);
}

// Parses manifest.json into `manifest` (format and version checked); returns the whole JSON.
nlohmann::json parse_manifest(const std::vector<char>& bytes, const fs::path& folder,
                              const std::string& where, CheckpointManifest& manifest) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.value("format", "") != "ampkit-checkpoint")
      fail(where + ": manifest.json is not an ampkit checkpoint manifest");
    const int version = j.at("format_version").get<int>();
    if (version != kCheckpointFormatVersion)
      fail(where + " has checkpoint format version " + std::to_string(version) +
           "; this ampkit reads version " + std::to_string(kCheckpointFormatVersion));
    manifest = manifest_from_json(j);
  } catch (const nlohmann::json::exception& e) {
    fail(where + ": " + (folder / kManifestFile).string() + " is malformed: " + e.what());
  }
  return j;
}

// A payload file whose size and SHA-256 match its entry in the manifest's "files".
std::vector<char> checked_file_bytes(const fs::path& folder, const std::string& where,
                                     const nlohmann::json& files, const char* name) {
  const fs::path file = folder / name;
  if (!files.contains(name)) fail(where + ": manifest.json lists no checksum for " + file.string());
  const std::string expected = files[name].value("sha256", "");
  const uint64_t size = files[name].value("bytes", uint64_t{0});
  // Never more than the manifest says: a file that is larger (or a device) is refused unread.
  std::optional<std::vector<char>> bytes = read_in(where, file, size);
  if (!bytes) fail(where + ": " + file.string() + " is missing (incomplete checkpoint)");
  if (bytes->size() != size)
    fail(where + ": " + file.string() + " has " + std::to_string(bytes->size()) +
         " bytes, the manifest says " + std::to_string(size) + " (truncated or corrupt)");
  const std::string digest = sha256_of(bytes->data(), bytes->size());
  if (digest != expected)
    fail(where + ": checksum mismatch for " + file.string() + ": SHA-256 " + digest + ", the manifest says " +
         expected);
  return std::move(*bytes);
}

}  // namespace

LoadedCheckpoint read_checkpoint(const fs::path& folder) {
  const std::string where = "checkpoint " + folder.string();
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) fail(where + " does not exist or is not a folder");
  LoadedCheckpoint out;
  out.folder = folder;
  const std::vector<char> manifest_bytes = checked_manifest_bytes(folder, where);
  const nlohmann::json j = parse_manifest(manifest_bytes, folder, where, out.manifest);
  const auto& files = j.contains("files") ? j["files"] : nlohmann::json::object();
  out.model_bytes = checked_file_bytes(folder, where, files, kModelFile);
  out.optimizer_bytes = checked_file_bytes(folder, where, files, kOptimizerFile);
  for (const auto& [name, unused] : files.items())  // the PyTorch-readable copies too
    if (name.find('/') != std::string::npos || name == ".." || name == ".")
      fail(where + ": manifest.json lists a file outside the folder ('" + name + "')");
    else if (name != kModelFile && name != kOptimizerFile)
      checked_file_bytes(folder, where, files, name.c_str());
  return out;
}

std::optional<fs::path> find_resume_checkpoint(const fs::path& dir, std::vector<std::string>* warnings) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  auto warn = [&](const std::string& w) {
    if (warnings) warnings->push_back(w);
  };
  fs::path tried;
  std::optional<std::vector<char>> latest;
  try {
    latest = read_bytes(dir / "latest", 4096);
  } catch (const Error& e) {
    warn(std::string("ignoring latest: ") + e.what());
  }
  if (latest) {
    std::string name(latest->begin(), latest->end());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
      name.pop_back();
    if (step_of(name) < 0) {
      warn((dir / "latest").string() + " does not name a checkpoint ('" + name +
           "'); looking for the newest valid one");
    } else {
      tried = dir / name;
      try {
        read_checkpoint(tried);
        return tried;
      } catch (const Error& e) {
        warn(std::string("skipping the checkpoint named by latest: ") + e.what());
      }
    }
  }
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->second == tried) continue;
    try {
      read_checkpoint(it->second);
      return it->second;
    } catch (const Error& e) {
      warn(std::string("skipping corrupt checkpoint: ") + e.what());
    }
  }
  return std::nullopt;
}

}  // namespace ampkit
