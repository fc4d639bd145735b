// TensorBoard event files (tensorflow/core/util/event.proto, summary.proto; the TFRecord
// framing of tensorflow/core/lib/io/record_writer.cc).
#include "ampkit/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "ampkit/error.h"

namespace ampkit {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protobuf wire format: a varint, a key (field number and wire type), fixed-width values.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field) << 3 | wire);
}
void fixed(std::string& out, const void* value, size_t n) {  // little-endian machines only
  out.append(static_cast<const char*>(value), n);
}
void bytes_field(std::string& out, int field, const std::string& value) {
  key(out, field, 2);
  varint(out, value.size());
  out += value;
}

// Event.session_log (event.proto: wall_time 1, step 2, file_version 3, graph_def 4, summary 5,
// log_message 6, deprecated, then session_log 7).
constexpr int kEventSessionLog = 7;

// Event { double wall_time = 1; int64 step = 2; ... }
std::string event_head(int64_t step) {
  std::string e;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  key(e, 1, 1);
  fixed(e, &now, 8);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

void little_endian_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void little_endian_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// One NaN for every NaN (whatever its sign and payload), as TensorBoard has always been given.
double canonical(double v) {
  return std::isnan(v) ? std::nan("") : v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& folder, int64_t first_step) {
  if (folder.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  file_ = folder / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
                    std::to_string(::getpid()) + ".0");
  out_.open(file_, std::ios::binary | std::ios::trunc);
  if (!out_)
    throw Error(ErrorCategory::output, "cannot write TensorBoard file " + file_.string() + ": " +
                                           (ec ? ec.message() : std::string(std::strerror(errno))));
  std::string version = event_head(first_step);
  bytes_field(version, 3, "brain.Event:2");  // Event.file_version
  write_event(version);
  // A resumed run: TensorBoard drops every earlier record at or after this step when it meets
  // Event.session_log (field 7) = SessionLog { status (1) = START (1) }. Field 6 is the deprecated
  // log_message, which TensorBoard ignores: the old steps were shown twice.
  if (first_step > 0) {
    std::string start = event_head(first_step);
    bytes_field(start, kEventSessionLog, std::string("\x08\x01", 2));
    write_event(start);
  }
}

void TensorBoardWriter::write_event(const std::string& event) {
  std::string record;
  little_endian_u64(record, event.size());
  little_endian_u32(record, masked_crc32c(record.data(), 8));
  record += event;
  little_endian_u32(record, masked_crc32c(event.data(), event.size()));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  if (!out_)
    throw Error(ErrorCategory::output, "cannot write TensorBoard file " + file_.string() + " (disk full?)");
}

void TensorBoardWriter::write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (!enabled()) return;
  std::string summary;  // Summary { repeated Value value = 1; }
  for (const auto& [tag, value] : scalars) {
    std::string v;  // Value { string tag = 1; float simple_value = 2; }
    bytes_field(v, 1, tag);
    const float f = static_cast<float>(value);
    key(v, 2, 5);
    fixed(v, &f, 4);
    bytes_field(summary, 1, v);
  }
  std::string event = event_head(step);
  bytes_field(event, 5, summary);  // Event.summary
  write_event(event);
}

void TensorBoardWriter::write_step(const StepRecord& r, const std::vector<std::string>& names,
                                   const std::vector<double>& norms) {
  if (!enabled()) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", canonical(r.loss)},
      {"train/lr", r.lr},
      {"train/scale", canonical(r.scale)},
      {"train/grad_norm", canonical(r.grad_norm)},
      {"train/grad_norm_clipped", canonical(r.grad_norm_clipped)},
      {"train/clip_threshold", canonical(r.clip_threshold)},
      {"train/clip_coef", canonical(r.clip_coef)},
      {"train/grad_max_abs", canonical(r.grad_max_abs)},
      {"train/zero_fraction", canonical(r.zero_fraction)},
      {"train/samples_per_second", canonical(r.samples_per_second)},
      {"train/skipped_steps", static_cast<double>(r.skipped_steps)}};
  if (r.steps_discarded)
    scalars.emplace_back("train/steps_discarded", static_cast<double>(*r.steps_discarded));
  if (r.rollbacks) scalars.emplace_back("train/rollbacks", static_cast<double>(*r.rollbacks));
  scalars.emplace_back("train/found_inf", r.found_inf ? 1.0 : 0.0);
  scalars.emplace_back("train/skipped", r.stepped ? 0.0 : 1.0);
  scalars.emplace_back("train/clipped", r.clipped ? 1.0 : 0.0);
  for (size_t i = 0; i < names.size() && i < norms.size(); ++i)
    scalars.emplace_back("layer_norms/" + names[i], norms[i]);
  write(r.step, scalars);
}

}  // namespace ampkit
