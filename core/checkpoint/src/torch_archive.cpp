// Opening torch.save archives: regular files without blocking, or bytes in memory; each record
// read within the archive's own size.
#include "torch_archive.h"

#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "ampkit/error.h"
#include "ampkit/pytorch_state.h"
#include "module_code.h"
#include "torch_unpickler.h"
#include "zip_directory.h"

namespace ampkit::checkpoint_files {

// The archive's bytes, from an open regular file (pread) or from memory.
class Source : public caffe2::serialize::ReadAdapterInterface {
 public:
  Source(int fd, size_t size) : fd_(fd), size_(size) {}
  Source(const char* data, size_t size) : data_(data), size_(size) {}
  ~Source() override {
    if (fd_ >= 0) ::close(fd_);
  }
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    // LibTorch asks for 0 bytes into a null buffer (an empty record): memcpy may not take null.
    if (pos >= size_ || n == 0) return 0;
    n = std::min<uint64_t>(n, size_ - pos);
    if (data_ != nullptr) {
      std::memcpy(buf, data_ + pos, n);
      return n;
    }
    size_t done = 0;
    while (done < n) {
      const ssize_t got =
          ::pread(fd_, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(pos + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  int fd_ = -1;
  const char* data_ = nullptr;
  size_t size_;
};

namespace {

// The reader's constructor already reads records: the directory is checked before it runs.
size_t checked_size(const Source& source, std::optional<uint64_t> max_expansion) {
  check_zip_directory(source, max_expansion);
  const uint64_t times = max_expansion.value_or(1);
  return source.size() > SIZE_MAX / times ? SIZE_MAX : source.size() * times;
}

}  // namespace

Archive::Archive(std::shared_ptr<Source> source, std::string where, std::optional<uint64_t> max_expansion)
    : budget_(checked_size(*source, max_expansion)), reader_(source), where_(std::move(where)) {}

std::tuple<at::DataPtr, size_t> Archive::read(const std::string& name) {
  const size_t declared = reader_.getRecordSize(name);
  if (declared > budget_)
    throw Error(ErrorCategory::checkpoint, where_ + ": not a weights-only torch.save file (record " + name +
                                               " declares " + std::to_string(declared) +
                                               " bytes, more than the file holds)");
  budget_ -= declared;
  return reader_.getRecord(name);
}

namespace {

c10::IValue load(std::shared_ptr<Source> source, const std::string& where) {
  try {
    Archive archive(std::move(source), where);
    return unpickle(archive, where);
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw Error(ErrorCategory::checkpoint,
                where + ": not a file torch.save wrote (" + what.substr(0, what.find('\n')) + ")");
  } catch (const std::exception& e) {  // the reader's own parsing (a version record stoull rejects)
    throw Error(ErrorCategory::checkpoint, where + ": not a file torch.save wrote (" + e.what() + ")");
  }
}

// Regular files only, opened without blocking: a FIFO would block open() and read(), a device
// such as /dev/zero never ends.
std::shared_ptr<Source> open_regular_file(const std::filesystem::path& file, ErrorCategory category,
                                          const std::string& where) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(category, where + ": cannot open " + file.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(category, where + ": " + file.string() + " is not a regular file");
  }
  return std::make_shared<Source>(fd, static_cast<size_t>(st.st_size));
}

}  // namespace

c10::IValue load_torch_file(const std::filesystem::path& file, const std::string& where) {
  return load(open_regular_file(file, ErrorCategory::checkpoint, where), where);
}

std::shared_ptr<Source> source_in_memory(const void* data, size_t size) {
  return std::make_shared<Source>(static_cast<const char*>(data), size);
}

c10::IValue load_torch_bytes(const void* data, size_t size, const std::string& where) {
  return load(std::make_shared<Source>(static_cast<const char*>(data), size), where);
}

}  // namespace ampkit::checkpoint_files

namespace ampkit {

std::shared_ptr<caffe2::serialize::ReadAdapterInterface> open_module_archive(
    const std::filesystem::path& file, ErrorCategory category, const std::string& where) {
  constexpr uint64_t kModuleExpansion = 64;
  auto archive = checkpoint_files::open_regular_file(file, category, where);
  constexpr size_t kMaxCode = size_t{4} << 20;  // what ampkit-train's loading stack is sized for
  checkpoint_files::Archive records(archive, where, kModuleExpansion);
  size_t total = 0;
  for (const std::string& name : records.records()) {
    if (!checkpoint_files::is_code_record(name)) continue;
    total += records.declared_size(name);
    if (total > kMaxCode)
      throw std::runtime_error("its code records hold more than " + std::to_string(kMaxCode) + " bytes");
    auto [code, n] = records.read(name);
    try {
      checkpoint_files::check_code_nesting({static_cast<const char*>(code.get()), n});
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(name + ": " + e.what());
    }
  }
  return archive;
}

}  // namespace ampkit
