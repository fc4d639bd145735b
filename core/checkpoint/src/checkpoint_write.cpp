// Writing checkpoint folders: temp folder, fsync, rename, `latest`, then the oldest go.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <ampkit/version.h>
#include <signal.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>

#include "ampkit/error.h"
#include "ampkit/pytorch_state.h"
#include "checkpoint_files.h"

namespace fs = std::filesystem;

namespace ampkit {

using namespace checkpoint_files;

namespace {

// Leftovers of a writer that died (.tmp-step-N-PID, .old-step-N-PID): removable once PID is gone.
void remove_stale_temporaries(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) != 0 && name.rfind(".old-step-", 0) != 0) continue;
    const auto dash = name.rfind('-');
    const long pid = std::strtol(name.c_str() + dash + 1, nullptr, 10);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

// Writes model.pt, optimizer.pt, manifest.json and manifest.sha256 into `tmp` and fsyncs it.
// Tensors leave as CPU copies, by name, so a checkpoint loads on any device.
// The PyTorch-readable optimizer.state_dict() file is written for the optimizers python has.
void write_files(const fs::path& tmp, CheckpointManifest manifest,
                 const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                 torch::optim::Optimizer& optimizer, const std::vector<CheckpointFile>& extra) {
  manifest.tensors.clear();
  for (const auto& [tensor_name, t] : tensors)
    manifest.tensors.push_back({tensor_name, std::string(c10::toString(t.scalar_type())), t.sizes().vec()});
  std::vector<CheckpointFile> files = {{kModelFile, pickle_bytes(tensor_dict(tensors))}};
  const std::string optim = optimizer_bytes(optimizer);
  files.push_back({kOptimizerFile, std::vector<char>(optim.begin(), optim.end())});
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer) || dynamic_cast<torch::optim::SGD*>(&optimizer))
    files.push_back({kOptimizerStateDictFile, pickle_bytes(optimizer_state_dict(optimizer))});
  files.insert(files.end(), extra.begin(), extra.end());
  nlohmann::json listed = nlohmann::json::object();
  for (const auto& f : files) {
    if (listed.contains(f.name) || f.name == kManifestFile || f.name == kManifestSumFile ||
        f.name.find('/') != std::string::npos)
      fail("checkpoint file name '" + f.name + "' is reserved or repeated");
    write_durable(tmp / f.name, f.bytes.data(), f.bytes.size());
    listed[f.name] = {{"sha256", sha256_of(f.bytes.data(), f.bytes.size())}, {"bytes", f.bytes.size()}};
  }

  manifest.ampkit_version = AMPKIT_VERSION_STRING;
  manifest.torch_version = AMPKIT_TORCH_VERSION;
  nlohmann::json j = manifest_to_json(manifest);
  j["files"] = listed;
  const std::string manifest_text = j.dump(1) + "\n";
  write_durable(tmp / kManifestFile, manifest_text);
  write_durable(tmp / kManifestSumFile,
                sha256_of(manifest_text.data(), manifest_text.size()) + "  " + kManifestFile + "\n");
  fsync_folder(tmp);
}

// Checkpoint folders this process wrote: known good, deleted by rotation without a second look.
std::mutex g_written_mutex;
std::set<fs::path> g_written;

// A folder about to be deleted that this process did not write is read first: deleting a corrupt
// one (found corrupt at resume, or damaged since) is said, never silent.
void say_if_corrupt(const fs::path& folder, std::vector<std::string>* warnings) {
  {
    std::lock_guard<std::mutex> lock(g_written_mutex);
    if (g_written.count(folder)) return;
  }
  try {
    read_checkpoint(folder);
  } catch (const Error& e) {
    if (warnings)
      warnings->push_back("deleting the corrupt checkpoint " + folder.string() + " (" + e.what() + ")");
  }
}

// Deletes a checkpoint folder already renamed to `doomed`; a folder that will not go (a file in
// it is immutable, a mount point, an I/O error) stays under that name, with a warning saying so.
void delete_aside(const fs::path& original, const fs::path& doomed, std::vector<std::string>* warnings) {
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (ec && warnings)
    warnings->push_back("could not delete the old checkpoint " + original.string() + " (left as " +
                        doomed.string() + "): " + ec.message() + "; delete it by hand");
}

// Puts the complete `tmp` in place as dir/name and points `latest` at it. A folder of the same
// step (a run resumed and stopped again at once) is replaced, never merged: move it aside, put
// the new one in place, then delete the old one.
fs::path publish(const fs::path& dir, const fs::path& tmp, const std::string& name, const std::string& pid,
                 std::vector<std::string>* warnings) {
  std::error_code ec;
  const fs::path final_path = dir / name;
  fs::path aside;
  if (fs::exists(final_path, ec)) {
    say_if_corrupt(final_path, warnings);
    aside = dir / (".old-" + name + "-" + pid);
    fs::remove_all(aside, ec);
    rename_or_fail(final_path, aside);
  }
  rename_or_fail(tmp, final_path);
  fsync_folder(dir);
  if (!aside.empty()) delete_aside(final_path, aside, warnings);

  const fs::path latest_tmp = dir / "latest.tmp";
  write_durable(latest_tmp, name + "\n");
  rename_or_fail(latest_tmp, dir / "latest");
  fsync_folder(dir);
  return final_path;
}

// Older checkpoints go only once the new one is complete; each is renamed away first so a crash
// mid-delete leaves a temporary, never a half-deleted `step-N`.
void remove_oldest(const fs::path& dir, const fs::path& newest, int keep, const std::string& pid,
                   std::vector<std::string>* warnings) {
  auto all = list_checkpoints(dir);
  const size_t excess = all.size() > static_cast<size_t>(keep) ? all.size() - static_cast<size_t>(keep) : 0;
  for (size_t i = 0; i < excess; ++i) {
    if (all[i].second == newest) continue;
    say_if_corrupt(all[i].second, warnings);
    const fs::path doomed = dir / (".old-" + all[i].second.filename().string() + "-" + pid);
    if (::rename(all[i].second.c_str(), doomed.c_str()) == 0) delete_aside(all[i].second, doomed, warnings);
  }
  remove_stale_temporaries(dir);
}

}  // namespace

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t n = step_of(entry.path().filename().string());
    if (n >= 0 && entry.is_directory(ec)) out.emplace_back(n, entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path write_checkpoint(const fs::path& dir, CheckpointManifest manifest,
                          const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          torch::optim::Optimizer& optimizer, int keep,
                          const std::vector<CheckpointFile>& extra, std::vector<std::string>* warnings) {
  if (keep < 1) fail("keep must be >= 1, got " + std::to_string(keep));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create checkpoint folder " + dir.string() + ": " + ec.message());
  const std::string name = "step-" + std::to_string(manifest.steps_attempted);
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = dir / (".tmp-" + name + "-" + pid);
  // Leftovers of writers that died (a full disk, a kill) go first, so retries do not fill the disk.
  remove_stale_temporaries(dir);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) fail("cannot create " + tmp.string() + ": " + ec.message());

  fs::path final_path;
  try {
    write_files(tmp, std::move(manifest), tensors, optimizer, extra);
    final_path = publish(dir, tmp, name, pid, warnings);
    std::lock_guard<std::mutex> lock(g_written_mutex);
    g_written.insert(final_path);
  } catch (...) {
    fs::remove_all(tmp, ec);  // a failed write leaves nothing behind
    throw;
  }
  remove_oldest(dir, final_path, keep, pid, warnings);
  return final_path;
}

}  // namespace ampkit
