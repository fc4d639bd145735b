// The file-level mechanics of checkpoint folders: durable writes, whole-file reads, names.
#include "checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "ampkit/error.h"
#include "ampkit/sha256.h"

namespace fs = std::filesystem;

namespace ampkit::checkpoint_files {

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

std::optional<std::vector<char>> read_bytes(const fs::path& file, uint64_t max_bytes) {
  // Without blocking and regular files only: a FIFO would block open() forever, a device such as
  // /dev/zero never ends. A file larger than the caller's bound is refused before any read.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    fail("cannot open " + file.string() + ": " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(file.string() + " is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    fail(file.string() + " has " + std::to_string(size) + " bytes, more than the " +
         std::to_string(max_bytes) + " expected");
  }
  std::vector<char> bytes(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = errno_text();
      ::close(fd);
      fail("cannot read " + file.string() + ": " + why);
    }
    if (n == 0) break;  // shrank while read: the size check below names it
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

bool is_hex_digest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  std::string bytes;
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to([&](const void* data, size_t size) {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

}  // namespace ampkit::checkpoint_files
