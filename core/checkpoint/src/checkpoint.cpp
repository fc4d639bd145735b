// Checkpoint folders: written to a temp folder, fsynced, renamed; verified file by file on load.
#include "ampkit/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <ampkit/version.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>

#include "ampkit/error.h"
#include "ampkit/sha256.h"

namespace fs = std::filesystem;

namespace ampkit {

namespace {

const char* const kModelFile = "model.pt";
const char* const kOptimizerFile = "optimizer.pt";
const char* const kManifestFile = "manifest.json";
const char* const kManifestSumFile = "manifest.sha256";

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCategory::checkpoint, message);
}

std::string errno_text() {
  return std::strerror(errno);
}

std::string sha256_of(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.hex();
}

// Writes the whole buffer and fsyncs it before returning: after this the bytes are on disk.
void write_durable(const fs::path& file, const void* data, size_t size) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create " + file.string() + ": " + errno_text());
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = errno_text();
      ::close(fd);
      fail("cannot write " + file.string() + ": " + why);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    fail("cannot fsync " + file.string() + ": " + why);
  }
  if (::close(fd) != 0) fail("cannot close " + file.string() + ": " + errno_text());
}

void write_durable(const fs::path& file, const std::string& text) {
  write_durable(file, text.data(), text.size());
}

// A rename or a new entry is durable only once its folder is fsynced.
void fsync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open folder " + folder.string() + ": " + errno_text());
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const std::string why = errno_text();
    ::close(fd);
    fail("cannot fsync folder " + folder.string() + ": " + why);
  }
  ::close(fd);
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail("cannot rename " + from.string() + " to " + to.string() + ": " + errno_text());
}

std::optional<std::vector<char>> read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return bytes;
}

// "step-<digits>" -> N, anything else -> -1.
int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

std::string hex_encode(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string hex_decode(const std::string& hex) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2) fail("RNG state in the manifest is not hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) fail("RNG state in the manifest is not hex");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

bool is_hex_digest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

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

nlohmann::json manifest_to_json(const CheckpointManifest& m) {
  nlohmann::json j;
  j["format"] = "ampkit-checkpoint";
  j["format_version"] = m.format_version;
  j["ampkit_version"] = m.ampkit_version;
  j["torch_version"] = m.torch_version;
  j["step"] = {{"attempted", m.steps_attempted},
               {"taken", m.steps_taken},
               {"consecutive_skips", m.consecutive_skips},
               {"epoch", m.epoch},
               {"data_position", m.steps_attempted}};
  j["config"] = m.config;
  j["plugins"] = nlohmann::json::array();
  for (const auto& p : m.plugins)
    j["plugins"].push_back(
        {{"kind", p.kind}, {"name", p.name}, {"version", p.version}, {"state", state_to_json(p.state)}});
  j["rng"] = {{"cpu", hex_encode(m.cpu_rng_state)}};
  j["param_sha256"] = m.param_sha256;
  j["host"] = m.host;
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : m.tensors)
    j["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
  return j;
}

CheckpointManifest manifest_from_json(const nlohmann::json& j) {
  CheckpointManifest m;
  m.format_version = j.at("format_version").get<int>();
  m.ampkit_version = j.at("ampkit_version").get<std::string>();
  m.torch_version = j.at("torch_version").get<std::string>();
  const auto& step = j.at("step");
  m.steps_attempted = step.at("attempted").get<int64_t>();
  m.steps_taken = step.at("taken").get<int64_t>();
  m.consecutive_skips = step.at("consecutive_skips").get<int64_t>();
  m.epoch = step.at("epoch").get<int64_t>();
  m.config = j.at("config");
  for (const auto& p : j.at("plugins"))
    m.plugins.push_back({p.at("kind").get<std::string>(), p.at("name").get<std::string>(),
                         p.at("version").get<std::string>(), state_from_json(p.at("state"))});
  m.cpu_rng_state = hex_decode(j.at("rng").at("cpu").get<std::string>());
  m.param_sha256 = j.at("param_sha256").get<std::string>();
  m.host = j.at("host");
  for (const auto& t : j.at("tensors"))
    m.tensors.push_back({t.at("name").get<std::string>(), t.at("dtype").get<std::string>(),
                         t.at("shape").get<std::vector<int64_t>>()});
  return m;
}

}  // namespace

nlohmann::json state_to_json(const State& state) {
  nlohmann::json out = nlohmann::json::object();
  auto f64 = [](double v) -> nlohmann::json {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return v;
  };
  for (const auto& [key, value] : state.values()) {
    nlohmann::json entry;
    if (const auto* b = std::get_if<bool>(&value))
      entry = {{"type", "bool"}, {"value", *b}};
    else if (const auto* i = std::get_if<int64_t>(&value))
      entry = {{"type", "i64"}, {"value", *i}};
    else if (const auto* d = std::get_if<double>(&value))
      entry = {{"type", "f64"}, {"value", f64(*d)}};
    else if (const auto* s = std::get_if<std::string>(&value))
      entry = {{"type", "str"}, {"value", *s}};
    else {
      nlohmann::json list = nlohmann::json::array();
      for (double v : std::get<std::vector<double>>(value)) list.push_back(f64(v));
      entry = {{"type", "f64[]"}, {"value", list}};
    }
    out[key] = entry;
  }
  return out;
}

State state_from_json(const nlohmann::json& json) {
  auto f64 = [](const nlohmann::json& v) -> double {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "nan") return std::nan("");
      if (s == "inf") return HUGE_VAL;
      if (s == "-inf") return -HUGE_VAL;
      fail("plugin state holds '" + s + "' where a number belongs");
    }
    return v.get<double>();
  };
  State state;
  for (const auto& [key, entry] : json.items()) {
    const std::string type = entry.at("type").get<std::string>();
    const auto& v = entry.at("value");
    if (type == "bool")
      state.set(key, v.get<bool>());
    else if (type == "i64")
      state.set(key, v.get<int64_t>());
    else if (type == "f64")
      state.set(key, f64(v));
    else if (type == "str")
      state.set(key, v.get<std::string>());
    else if (type == "f64[]") {
      std::vector<double> list;
      for (const auto& x : v) list.push_back(f64(x));
      state.set(key, std::move(list));
    } else {
      fail("plugin state key '" + key + "' has unknown type '" + type + "'");
    }
  }
  return state;
}

std::string cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  const at::Tensor s = gen.get_state().contiguous();
  return std::string(static_cast<const char*>(s.data_ptr()), static_cast<size_t>(s.nbytes()));
}

void set_cpu_rng_state(const std::string& bytes) {
  at::Tensor s = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(s.data_ptr(), bytes.data(), bytes.size());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(s);
  } catch (const c10::Error& e) {
    fail(std::string("the checkpoint's CPU RNG state does not fit this LibTorch: ") +
         e.what_without_backtrace());
  }
}

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
                          torch::optim::Optimizer& optimizer, int keep) {
  if (keep < 1) fail("keep must be >= 1, got " + std::to_string(keep));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create checkpoint folder " + dir.string() + ": " + ec.message());
  const std::string name = "step-" + std::to_string(manifest.steps_attempted);
  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = dir / (".tmp-" + name + "-" + pid);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) fail("cannot create " + tmp.string() + ": " + ec.message());

  // Tensors leave as CPU copies, by name, so a checkpoint loads on any device.
  c10::Dict<std::string, at::Tensor> dict;
  manifest.tensors.clear();
  for (const auto& [tensor_name, t] : tensors) {
    dict.insert(tensor_name, t.detach().to(at::kCPU).contiguous());
    manifest.tensors.push_back({tensor_name, std::string(c10::toString(t.scalar_type())), t.sizes().vec()});
  }
  const std::vector<char> model = torch::pickle_save(c10::IValue(dict));
  std::string optim;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to([&](const void* data, size_t size) {
      optim.append(static_cast<const char*>(data), size);
      return size;
    });
  }
  write_durable(tmp / kModelFile, model.data(), model.size());
  write_durable(tmp / kOptimizerFile, optim.data(), optim.size());

  manifest.ampkit_version = AMPKIT_VERSION_STRING;
  manifest.torch_version = AMPKIT_TORCH_VERSION;
  nlohmann::json j = manifest_to_json(manifest);
  j["files"] = {
      {kModelFile, {{"sha256", sha256_of(model.data(), model.size())}, {"bytes", model.size()}}},
      {kOptimizerFile, {{"sha256", sha256_of(optim.data(), optim.size())}, {"bytes", optim.size()}}}};
  const std::string manifest_text = j.dump(1) + "\n";
  write_durable(tmp / kManifestFile, manifest_text);
  write_durable(tmp / kManifestSumFile,
                sha256_of(manifest_text.data(), manifest_text.size()) + "  " + kManifestFile + "\n");
  fsync_folder(tmp);

  // A folder of the same step (a run resumed and stopped again at once) is replaced, never
  // merged: move it aside, put the new one in place, then delete the old one.
  const fs::path final_path = dir / name;
  fs::path aside;
  if (fs::exists(final_path, ec)) {
    aside = dir / (".old-" + name + "-" + pid);
    fs::remove_all(aside, ec);
    rename_or_fail(final_path, aside);
  }
  rename_or_fail(tmp, final_path);
  fsync_folder(dir);
  if (!aside.empty()) fs::remove_all(aside, ec);

  const fs::path latest_tmp = dir / "latest.tmp";
  write_durable(latest_tmp, name + "\n");
  rename_or_fail(latest_tmp, dir / "latest");
  fsync_folder(dir);

  // Older checkpoints go only now that the new one is complete; each is renamed away first so
  // a crash mid-delete leaves a temporary, never a half-deleted `step-N`.
  auto all = list_checkpoints(dir);
  const size_t excess = all.size() > static_cast<size_t>(keep) ? all.size() - static_cast<size_t>(keep) : 0;
  for (size_t i = 0; i < excess; ++i) {
    if (all[i].second == final_path) continue;
    const fs::path doomed = dir / (".old-" + all[i].second.filename().string() + "-" + pid);
    if (::rename(all[i].second.c_str(), doomed.c_str()) == 0) fs::remove_all(doomed, ec);
  }
  remove_stale_temporaries(dir);
  return final_path;
}

LoadedCheckpoint read_checkpoint(const fs::path& folder) {
  const std::string where = "checkpoint " + folder.string();
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) fail(where + " does not exist or is not a folder");
  LoadedCheckpoint out;
  out.folder = folder;

  const auto sum_bytes = read_bytes(folder / kManifestSumFile);
  if (!sum_bytes)
    fail(where + ": " + (folder / kManifestSumFile).string() + " is missing (incomplete checkpoint)");
  const std::string sum_text(sum_bytes->begin(), sum_bytes->end());
  const std::string expected_line_tail = std::string("  ") + kManifestFile + "\n";
  const std::string manifest_digest = sum_text.substr(0, 64);
  if (sum_text.size() != 64 + expected_line_tail.size() || !is_hex_digest(manifest_digest) ||
      sum_text.compare(64, std::string::npos, expected_line_tail) != 0)
    fail(where + ": " + (folder / kManifestSumFile).string() + " is corrupt (not '<sha256>  manifest.json')");
  const auto manifest_bytes = read_bytes(folder / kManifestFile);
  if (!manifest_bytes)
    fail(where + ": " + (folder / kManifestFile).string() + " is missing (incomplete checkpoint)");
  const std::string actual = sha256_of(manifest_bytes->data(), manifest_bytes->size());
  if (actual != manifest_digest)
    fail(where + ": checksum mismatch for " + (folder / kManifestFile).string() + ": SHA-256 " + actual +
         ", but " + (folder / kManifestSumFile).string() + " says " + manifest_digest +
         " (manifest.json or manifest.sha256 is corrupt)");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(manifest_bytes->begin(), manifest_bytes->end());
    if (j.value("format", "") != "ampkit-checkpoint")
      fail(where + ": manifest.json is not an ampkit checkpoint manifest");
    const int version = j.at("format_version").get<int>();
    if (version != kCheckpointFormatVersion)
      fail(where + " has checkpoint format version " + std::to_string(version) +
           "; this ampkit reads version " + std::to_string(kCheckpointFormatVersion));
    out.manifest = manifest_from_json(j);
  } catch (const nlohmann::json::exception& e) {
    fail(where + ": " + (folder / kManifestFile).string() + " is malformed: " + e.what());
  }

  const auto& files = j.contains("files") ? j["files"] : nlohmann::json::object();
  for (const char* name : {kModelFile, kOptimizerFile}) {
    const fs::path file = folder / name;
    if (!files.contains(name)) fail(where + ": manifest.json lists no checksum for " + file.string());
    auto bytes = read_bytes(file);
    if (!bytes) fail(where + ": " + file.string() + " is missing (incomplete checkpoint)");
    const std::string expected = files[name].value("sha256", "");
    const uint64_t size = files[name].value("bytes", uint64_t{0});
    if (bytes->size() != size)
      fail(where + ": " + file.string() + " has " + std::to_string(bytes->size()) +
           " bytes, the manifest says " + std::to_string(size) + " (truncated or corrupt)");
    const std::string digest = sha256_of(bytes->data(), bytes->size());
    if (digest != expected)
      fail(where + ": checksum mismatch for " + file.string() + ": SHA-256 " + digest +
           ", the manifest says " + expected);
    (std::string(name) == kModelFile ? out.model_bytes : out.optimizer_bytes) = std::move(*bytes);
  }
  return out;
}

std::optional<fs::path> find_resume_checkpoint(const fs::path& dir, std::vector<std::string>* warnings) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return std::nullopt;
  auto warn = [&](const std::string& w) {
    if (warnings) warnings->push_back(w);
  };
  fs::path tried;
  if (const auto latest = read_bytes(dir / "latest")) {
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

void restore_tensors(const LoadedCheckpoint& checkpoint,
                     const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const std::string where = "checkpoint " + checkpoint.folder.string();
  const auto& saved = checkpoint.manifest.tensors;
  const size_t n = std::max(saved.size(), tensors.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= saved.size())
      fail(where + " was saved from a different model: this model has parameter '" + tensors[i].first +
           "', the checkpoint has no more parameters (" + std::to_string(saved.size()) + " in all)");
    if (i >= tensors.size())
      fail(where + " was saved from a different model: the checkpoint has parameter '" + saved[i].name +
           "', this model has no more parameters (" + std::to_string(tensors.size()) + " in all)");
    const auto& s = saved[i];
    const auto& [name, t] = tensors[i];
    const std::string dtype = c10::toString(t.scalar_type());
    if (s.name != name)
      fail(where + " was saved from a different model: parameter " + std::to_string(i) + " is '" + s.name +
           "' in the checkpoint, '" + name + "' in this model");
    if (s.shape != t.sizes().vec())
      fail(where + " was saved from a different model: parameter '" + name + "' has shape " +
           shape_text(s.shape) + " in the checkpoint, " + shape_text(t.sizes().vec()) + " in this model");
    if (s.dtype != dtype)
      fail(where + " was saved from a different model: parameter '" + name + "' has dtype " + s.dtype +
           " in the checkpoint, " + dtype + " in this model");
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  try {
    const c10::IValue value = torch::pickle_load(checkpoint.model_bytes);
    dict = value.toGenericDict();
  } catch (const c10::Error& e) {
    fail(where + ": " + (checkpoint.folder / kModelFile).string() +
         " cannot be read: " + e.what_without_backtrace());
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) {
    auto it = dict.find(name);
    if (it == dict.end())
      fail(where + ": " + (checkpoint.folder / kModelFile).string() + " has no tensor '" + name + "'");
    const at::Tensor value = it->value().toTensor();
    if (value.sizes() != t.sizes() || value.scalar_type() != t.scalar_type())
      fail(where + ": tensor '" + name + "' in " + kModelFile + " does not match its manifest entry");
    at::Tensor target = t;
    target.copy_(value);
  }
}

void restore_optimizer(const LoadedCheckpoint& checkpoint, torch::optim::Optimizer& optimizer) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(checkpoint.optimizer_bytes.data(), checkpoint.optimizer_bytes.size());
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    fail("checkpoint " + checkpoint.folder.string() + ": the optimizer state in " + kOptimizerFile +
         " does not fit this optimizer (another --optimizer?): " + e.what_without_backtrace());
  }
}

void MemorySnapshot::capture(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                             torch::optim::Optimizer& optimizer, int64_t steps_attempted,
                             int64_t steps_taken) {
  torch::NoGradGuard no_grad;
  names_.clear();
  values_.clear();
  for (const auto& [name, t] : tensors) {
    names_.push_back(name);
    values_.push_back(t.detach().clone());
  }
  optimizer_.clear();
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to([&](const void* data, size_t size) {
    optimizer_.append(static_cast<const char*>(data), size);
    return size;
  });
  attempted_ = steps_attempted;
  taken_ = steps_taken;
  captured_ = true;
}

int64_t MemorySnapshot::restore(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                torch::optim::Optimizer& optimizer) const {
  if (!captured_) throw Error(ErrorCategory::internal, "rollback before any snapshot was taken");
  if (tensors.size() != values_.size())
    throw Error(ErrorCategory::internal, "rollback: the model has " + std::to_string(tensors.size()) +
                                             " tensors, the snapshot " + std::to_string(values_.size()));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].first != names_[i] || tensors[i].second.sizes() != values_[i].sizes())
      throw Error(ErrorCategory::internal,
                  "rollback: tensor '" + tensors[i].first + "' does not match the snapshot");
    at::Tensor target = tensors[i].second;
    target.copy_(values_[i]);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(optimizer_.data(), optimizer_.size());
  optimizer.load(archive);
  return taken_;
}

}  // namespace ampkit
