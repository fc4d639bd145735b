// Atomic, checksummed checkpoints: model and optimizer tensors plus a JSON manifest of the rest.
#pragma once

#include <ATen/core/Tensor.h>
#include <ampkit/state.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ampkit {

// Layout of one checkpoint folder `step-<N>` (N = optimizer steps attempted):
//   model.pt         parameters and buffers by name (torch::pickle_save of a name -> tensor dict):
//                    python's model.load_state_dict(torch.load(f, weights_only=True)) takes it
//   optimizer.pt     optimizer state (torch::serialize::OutputArchive, as torch::save writes it)
//   optimizer_state_dict.pt  the same state in python's optimizer.state_dict() layout (AdamW,
//                    SGD; pytorch_state.h), for torch.optim.AdamW.load_state_dict
//   <extra files>    what the host adds (ampkit-train: scaler_state_dict.pt, GradScaler's form)
//   manifest.json    everything else (below) and the SHA-256 and size of every file above
//   manifest.sha256  the SHA-256 of manifest.json, in `sha256sum -c` format
inline constexpr int kCheckpointFormatVersion = 1;

struct PluginStateRecord {
  std::string kind, name, version;
  State state;
};

struct TensorRecord {
  std::string name;
  std::string dtype;  // c10::toString of the scalar type, e.g. "Float"
  std::vector<int64_t> shape;
};

// One effective setting of the run that wrote a checkpoint (an ampkit-train option).
struct ManifestSetting {
  std::string value;
  std::string source;  // where the value came from: "default", "command line", ...
};

// What the manifest holds besides the file checksums.
struct CheckpointManifest {
  int format_version = kCheckpointFormatVersion;
  int64_t steps_attempted = 0;  // also the data position: batch order is a function of it
  int64_t steps_taken = 0;      // the LR schedule position
  int64_t consecutive_skips = 0;
  int64_t epoch = 0;
  // The effective settings by name; in the file an array of {name, value, source}, sorted by name.
  std::map<std::string, ManifestSetting> config;
  std::vector<PluginStateRecord> plugins;
  std::string cpu_rng_state;  // raw bytes of LibTorch's default CPU generator state
  std::string param_sha256;
  nlohmann::json host = nlohmann::json::object();  // host-owned counters (summary statistics)
  std::vector<TensorRecord> tensors;               // filled by write_checkpoint
  std::string ampkit_version, torch_version;       // filled by write_checkpoint
};

// A verified checkpoint: every file matched its checksum; the payload bytes are those verified.
struct LoadedCheckpoint {
  std::filesystem::path folder;
  CheckpointManifest manifest;
  std::vector<char> model_bytes;
  std::vector<char> optimizer_bytes;
};

// Writes `step-<manifest.steps_attempted>` under `dir`: temp folder, fsync of every file and the
// folder, rename, fsync of `dir`; then switches `latest` atomically and removes all but the
// newest `keep` complete checkpoints (and temp folders of processes that no longer run).
// Returns the new folder. Throws Error(checkpoint) naming the path on any I/O failure. An old
// checkpoint that cannot be deleted is left as .old-step-N-PID and named in `warnings`.
struct CheckpointFile {
  std::string name;  // a plain file name inside the folder
  std::vector<char> bytes;
};
std::filesystem::path write_checkpoint(const std::filesystem::path& dir, CheckpointManifest manifest,
                                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                       torch::optim::Optimizer& optimizer, int keep,
                                       const std::vector<CheckpointFile>& extra = {},
                                       std::vector<std::string>* warnings = nullptr);

// Reads and verifies a checkpoint folder: manifest.sha256 against manifest.json, then the size
// and SHA-256 of every file the manifest lists. Throws Error(checkpoint) naming the bad file.
LoadedCheckpoint read_checkpoint(const std::filesystem::path& folder);

// The checkpoint `--resume auto` takes: the folder named by `latest` if it verifies, else the
// newest `step-<N>` that verifies. Each folder passed over adds a warning naming it and why.
// No valid checkpoint (or no `dir`): std::nullopt.
std::optional<std::filesystem::path> find_resume_checkpoint(const std::filesystem::path& dir,
                                                            std::vector<std::string>* warnings = nullptr);

// Complete `step-<N>` folders under `dir` (no verification), by N ascending.
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& dir);

// Checks names, dtypes and shapes against the checkpoint (Error(checkpoint) naming the first
// difference), then copies the saved values into `tensors` in place.
void restore_tensors(const LoadedCheckpoint& checkpoint,
                     const std::vector<std::pair<std::string, at::Tensor>>& tensors);
void restore_optimizer(const LoadedCheckpoint& checkpoint, torch::optim::Optimizer& optimizer);

// An in-memory copy of the model's tensors and the optimizer state, for the rollback NaN policy:
// restore() puts back exactly the captured bytes (parameters bit for bit).
class MemorySnapshot {
 public:
  void capture(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
               torch::optim::Optimizer& optimizer, int64_t steps_attempted, int64_t steps_taken);
  // Copies the captured values back in place (same names, shapes and dtypes as captured);
  // returns the optimizer steps taken at capture.
  int64_t restore(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  torch::optim::Optimizer& optimizer) const;
  bool empty() const { return !captured_; }
  int64_t steps_attempted() const { return attempted_; }  // the step the snapshot was taken before
  int64_t steps_taken() const { return taken_; }

 private:
  bool captured_ = false;
  std::vector<std::string> names_;
  std::vector<at::Tensor> values_;
  std::string optimizer_;
  int64_t attempted_ = 0, taken_ = 0;
};

// LibTorch's default CPU generator state as bytes, and back.
std::string cpu_rng_state();
void set_cpu_rng_state(const std::string& bytes);

// A strategy State as tagged JSON ({"key": {"type": "f64", "value": 0.5}}); doubles round-trip
// exactly, non-finite doubles are written as "nan", "inf", "-inf".
nlohmann::json state_to_json(const State& state);
State state_from_json(const nlohmann::json& json);

}  // namespace ampkit
