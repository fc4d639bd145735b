// JSONL metrics, progress line, parameter hash and summary output.
#include "ampkit/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "ampkit/error.h"
#include "ampkit/sha256.h"

namespace ampkit {

namespace {
// JSON has no inf/NaN; they become strings so a record never breaks a parser.
nlohmann::json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600)
    o << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    o << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    o << s << "s";
  return o.str();
}
}  // namespace

namespace {
// The folder an output file goes into, created if missing; a failure is an output error.
void create_parent_folder(const std::filesystem::path& file) {
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec)
    throw Error(ErrorCategory::output, "cannot create the folder of " + file.string() + ": " + ec.message());
}

// Writes `text` to a temporary file beside `file`, flushed and checked, then renames it over
// `file`: a failure (a full disk) leaves the previous file as it was and says why.
void replace_file(const std::filesystem::path& file, const std::string& text, const std::string& what) {
  create_parent_folder(file);
  const std::filesystem::path tmp = file.string() + ".tmp-" + std::to_string(::getpid());
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (out) {
      out << text;
      out.flush();
      written = static_cast<bool>(out);
      out.close();
      written = written && !out.fail();
    }
  }
  std::error_code ec;
  if (written) std::filesystem::rename(tmp, file, ec);
  if (!written || ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(ErrorCategory::output, "cannot write " + what + " file " + file.string() +
                                           " (disk full or not writable); the previous one is unchanged");
  }
}

// Opens a per-step log for a run that starts at `first_step`. A resumed run keeps the earlier
// lines whose step (read by `step_of`, -1 for a header, nullopt for a torn line) is before
// first_step — the steps after the checkpoint are run again and written again — so the file
// holds each step exactly once, as an uninterrupted run's would.
void open_log(std::ofstream& out, const std::filesystem::path& file, int64_t first_step, const char* what,
              const std::function<std::optional<int64_t>(const std::string&)>& step_of) {
  create_parent_folder(file);
  std::string kept;
  if (first_step > 0 && std::filesystem::exists(file)) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      const auto step = step_of(line);
      if (step && *step < first_step) kept += line + '\n';
    }
  }
  // A resumed run rewrites the kept records through a temporary file: a kill or a full disk
  // now leaves the old file whole, never an empty one.
  if (first_step > 0) replace_file(file, kept, what);
  out.open(file, std::ios::out | (first_step > 0 ? std::ios::app : std::ios::trunc));
  if (!out)
    throw Error(ErrorCategory::output, std::string("cannot write ") + what + " file " + file.string());
}

// After every record: flushed, and a failed write (a full disk) is an error, not a lost line.
void check_written(std::ofstream& out, const std::filesystem::path& file, const char* what) {
  out.flush();
  if (!out)
    throw Error(ErrorCategory::output,
                std::string("cannot write ") + what + " file " + file.string() + " (disk full?)");
}
}  // namespace

MetricsWriter::MetricsWriter(const std::filesystem::path& file, int64_t first_step) : file_(file) {
  if (file.empty()) return;
  open_log(out_, file, first_step, "metrics", [](const std::string& line) -> std::optional<int64_t> {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      return std::nullopt;
    return record["step"].get<int64_t>();
  });
}

void MetricsWriter::write(const StepRecord& record) {
  write(record.to_json());
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  check_written(out_, file_, "metrics");
}

namespace {
// A record field as JSON: numbers through number() (a finite one is written as it is).
nlohmann::json field_json(double v) {
  return number(v);
}
nlohmann::json field_json(const std::vector<LayerNorm>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const LayerNorm& l : layers) out.push_back({{"name", l.name}, {"grad_norm", number(l.grad_norm)}});
  return out;
}
template <class T>
nlohmann::json field_json(const T& v) {
  return v;
}
}  // namespace

nlohmann::json StepRecord::to_json() const {
  nlohmann::json r;
  visit([&](const char* key, const auto& value) { r[key] = field_json(value); });
  return r;
}

std::vector<size_t> largest_norms(const std::vector<double>& norms, int64_t k) {
  std::vector<size_t> order(norms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t n = std::min(order.size(), static_cast<size_t>(std::max<int64_t>(k, 0)));
  // A NaN norm is the one a user hunting an overflow wants to see first.
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](size_t a, size_t b) {
                      const bool na = std::isnan(norms[a]), nb = std::isnan(norms[b]);
                      if (na != nb) return na;
                      if (norms[a] != norms[b]) return norms[a] > norms[b];
                      return a < b;
                    });
  order.resize(n);
  return order;
}

std::vector<LayerNorm> top_layers(const std::vector<std::string>& names, const std::vector<double>& norms,
                                  int64_t k) {
  if (names.size() != norms.size())
    throw Error(ErrorCategory::internal, "top_layers: " + std::to_string(names.size()) +
                                             " parameter names for " + std::to_string(norms.size()) +
                                             " gradient norms");
  std::vector<LayerNorm> out;
  for (size_t i : largest_norms(norms, k)) out.push_back({names[i], norms[i]});
  return out;
}

LayerNormWriter::LayerNormWriter(const std::filesystem::path& file, int64_t first_step) : file_(file) {
  if (file.empty()) return;
  bool header = false;
  open_log(out_, file, first_step, "layer norms", [&](const std::string& line) -> std::optional<int64_t> {
    if (line == "step,name,grad_norm") {
      header = true;
      return -1;
    }
    char* end = nullptr;
    const long long step = std::strtoll(line.c_str(), &end, 10);
    if (end == line.c_str() || *end != ',') return std::nullopt;
    return step;
  });
  if (!header) out_ << "step,name,grad_norm\n";
  check_written(out_, file_, "layer norms");
}

void LayerNormWriter::write(int64_t step, const std::vector<std::string>& names,
                            const std::vector<double>& norms) {
  if (!out_.is_open()) return;
  if (names.size() != norms.size())
    throw Error(ErrorCategory::internal, "layer norms: " + std::to_string(names.size()) +
                                             " parameter names for " + std::to_string(norms.size()) +
                                             " gradient norms");
  for (size_t i = 0; i < norms.size(); ++i) {
    std::string name = names[i];
    if (name.find_first_of(",\"\n") != std::string::npos) {  // RFC 4180 quoting
      std::string quoted = "\"";
      for (char c : name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      name = quoted + "\"";
    }
    char value[40];
    if (std::isfinite(norms[i]))
      std::snprintf(value, sizeof value, "%.17g", norms[i]);
    else
      std::snprintf(value, sizeof value, "%s", std::isnan(norms[i]) ? "nan" : "inf");
    out_ << step << ',' << name << ',' << value << '\n';
  }
  check_written(out_, file_, "layer norms");
}

ProgressLine::ProgressLine(int64_t total_steps, int64_t every, bool enabled)
    : total_(total_steps),
      every_(every > 0 ? every : 50),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(int64_t done, const StepRecord& last) {
  if (!enabled_) return;
  if (!tty_ && done % every_ != 0 && done != total_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta =
      done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : NAN;
  char line[256];
  std::snprintf(
      line, sizeof line, "step %lld/%lld  loss %.4f  scale %g  gnorm %.3g  %s  %.0f samples/s  ETA %s",
      static_cast<long long>(done), static_cast<long long>(total_), last.loss, last.scale, last.grad_norm,
      to_string(last.action), last.samples_per_second, format_duration(eta).c_str());
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s", line);
  else
    std::fprintf(stderr, "%s\n", line);
}

void ProgressLine::finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

std::string parameter_sha256(const std::vector<at::Tensor>& parameters) {
  Sha256 h;
  for (const auto& p : parameters) {
    const at::Tensor c = p.detach().to(at::kCPU).contiguous();
    h.update(c.data_ptr(), c.numel() * c.element_size());
  }
  return h.hex();
}

void write_json_file(const std::filesystem::path& file, const nlohmann::json& summary) {
  // Paths and plugin summaries come from the file system and plugin files: bytes that are not
  // UTF-8 become U+FFFD rather than failing the write (the values users set are checked at start).
  replace_file(file, summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "JSON");
}

void print_summary_table(std::FILE* out, const nlohmann::json& summary) {
  std::fprintf(out, "\n%-22s %s\n", "summary", "");
  for (const auto& [key, value] : summary.items()) {
    if (value.is_null()) continue;  // nothing to say (located_by when no rank located a fault)
    std::string text;
    if (key == "plugins") {
      for (const auto& [kind, p] : value.items())
        text += (text.empty() ? "" : ", ") + kind + "=" + p.value("name", "?") + " " + p.value("version", "");
    } else if (key == "nan_reports") {
      if (value.empty()) continue;
      text = std::to_string(value.size()) + " locator report(s), first: " + value[0].value("report", "");
    } else if (key == "step" &&
               value.is_object()) {  // "fused_scan statistics, deferred host sync, 0 host reads"
      text = value.value("stats_recipe", "?") + " statistics, " + value.value("host_sync", "?") +
             " host sync, " + std::to_string(value.value("host_reads", int64_t{0})) + " host reads";
    } else if (value.is_string()) {
      text = value.get<std::string>();
    } else if (value.is_number_float()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.6g", value.get<double>());
      text = buf;
    } else {
      text = value.dump();
    }
    std::fprintf(out, "  %-20s %s\n", key.c_str(), text.c_str());
  }
}

}  // namespace ampkit
