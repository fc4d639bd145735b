// Checking a zip archive's central directory before LibTorch's reader opens it (zip_directory.h).
// miniz.c (LibTorch's third_party/miniz) is the reference: mz_zip_reader_locate_header_sig,
// mz_zip_reader_read_central_dir and mz_zip_file_stat_internal. Only the refusals that guard an
// allocation are repeated here; miniz still makes all of its own checks afterwards.
#include "zip_directory.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

namespace ampkit::checkpoint_files {

namespace {

constexpr uint32_t kEndSignature = 0x06054b50, kZip64LocatorSignature = 0x07064b50,
                   kZip64EndSignature = 0x06064b50, kEntrySignature = 0x02014b50;
constexpr size_t kEndSize = 22, kZip64LocatorSize = 20, kZip64EndSize = 56, kEntrySize = 46;
constexpr uint64_t kAllOnes32 = 0xFFFFFFFF;
constexpr size_t kMaxName = 511;  // PyTorchStreamReader::getAllRecords' buffer holds 511 bytes and a NUL
constexpr uint16_t kZip64ExtraField = 0x0001;

uint64_t little(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

// A record name as one printable line (the file's bytes are anyone's).
std::string shown(const uint8_t* name, size_t n) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(n, 200); ++i)
    out += name[i] >= 0x20 && name[i] < 0x7f ? static_cast<char>(name[i]) : '?';
  return n > 200 ? out + "..." : out;
}

// miniz looks names up ignoring ASCII case (MZ_TOLOWER).
bool same_name(const uint8_t* name, size_t n, const std::string& wanted) {
  const auto lower = [](unsigned char c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; };
  if (n != wanted.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (lower(name[i]) != lower(static_cast<unsigned char>(wanted[i]))) return false;
  return true;
}

class Directory {
 public:
  explicit Directory(const caffe2::serialize::ReadAdapterInterface& in) : in_(in), size_(in.size()) {}

  void check(std::optional<uint64_t> max_expansion) const {
    const Layout dir = end_record(find_end());
    if (dir.entries != dir.entries_on_disk ||
        ((dir.disk | dir.directory_disk) != 0 && (dir.disk != 1 || dir.directory_disk != 1)))
      bad("spans several disks");
    // miniz allocates 4 bytes per entry, twice, by this count before it walks the entries; it
    // refuses a count the directory cannot hold as well, refused here first for a clear message.
    if (dir.entries * kEntrySize > dir.size || dir.offset > size_ || dir.size > size_ - dir.offset)
      bad("does not fit the file: " + std::to_string(dir.entries) + " entries in " +
          std::to_string(dir.size) + " bytes at offset " + std::to_string(dir.offset) + " of a " +
          std::to_string(size_) + "-byte file");
    std::vector<uint8_t> directory(dir.size);  // at most the file; miniz reads it whole too
    if (!directory.empty()) read(dir.offset, directory.data(), directory.size());
    const uint64_t max_total = max_expansion && *max_expansion < UINT64_MAX / std::max<uint64_t>(size_, 1)
                                   ? *max_expansion * size_
                                   : UINT64_MAX;
    std::vector<std::string> opening;  // the records the reader's constructor reads
    uint64_t total = 0;
    for (size_t i = 0, pos = 0; i < dir.entries; ++i) {
      const Entry e = entry(directory.data() + pos, directory.size() - pos, i);
      // LibTorch lists records (getAllRecords) through a 512-byte buffer: a longer name would come
      // back cut, and a check that picks records by name would miss it; a NUL cuts it the same way.
      if (e.name_size > kMaxName || std::memchr(e.name, 0, e.name_size) != nullptr)
        throw std::runtime_error("record name " + shown(e.name, e.name_size) + " is longer than " +
                                 std::to_string(kMaxName) + " bytes or holds a NUL");
      if (i == 0) opening = records_read_on_opening(e);
      const bool read_on_opening = std::any_of(opening.begin(), opening.end(), [&](const std::string& name) {
        return same_name(e.name, e.name_size, name);
      });
      if (read_on_opening && e.uncompressed > size_)
        throw std::runtime_error("record " + shown(e.name, e.name_size) + " declares " +
                                 std::to_string(e.uncompressed) + " bytes, more than the file holds");
      if (max_expansion && e.uncompressed > max_total - total)
        throw std::runtime_error(*max_expansion == 1
                                     ? std::string("its records declare more bytes than the file holds")
                                     : "its records declare more than " + std::to_string(*max_expansion) +
                                           " times the file's " + std::to_string(size_) + " bytes");
      total += max_expansion ? e.uncompressed : 0;
      pos += e.length;
    }
  }

 private:
  struct Layout {
    uint64_t entries, entries_on_disk, disk, directory_disk, size, offset;
  };

  [[noreturn]] static void bad(const std::string& what) {
    throw std::runtime_error("its zip directory " + what);
  }
  void read(uint64_t pos, void* buf, size_t n) const {
    if (pos > size_ || n > size_ - pos || in_.read(pos, buf, n, "reading the zip directory") != n)
      bad("reaches past the end of the file");
  }

  // The last end-of-directory signature with a whole record after it, scanning back from the end
  // in 4 KiB blocks that overlap by 3 bytes, no further than 64 KiB + 22 bytes from the end.
  uint64_t find_end() const {
    if (size_ < kEndSize) bad("is missing (the file is shorter than its end record)");
    std::array<uint8_t, 4096> buf{};
    uint64_t ofs = size_ > buf.size() ? size_ - buf.size() : 0;
    while (true) {
      const size_t n = std::min<uint64_t>(buf.size(), size_ - ofs);
      read(ofs, buf.data(), n);
      for (size_t i = n - 3; i-- > 0;)
        if (little(&buf[i], 4) == kEndSignature && size_ - (ofs + i) >= kEndSize) return ofs + i;
      if (ofs == 0 || size_ - ofs >= 0xFFFF + kEndSize) bad("is missing (no end record)");
      ofs = ofs > buf.size() - 3 ? ofs - (buf.size() - 3) : 0;
    }
  }

  // The end record, and the zip64 end record where a locator right before it points at one.
  Layout end_record(uint64_t at) const {
    uint8_t end[kEndSize];
    read(at, end, kEndSize);
    Layout l{little(end + 10, 2), little(end + 8, 2),  little(end + 4, 2),
             little(end + 6, 2),  little(end + 12, 4), little(end + 16, 4)};
    if (at < kZip64LocatorSize + kZip64EndSize) return l;
    uint8_t locator[kZip64LocatorSize];
    read(at - kZip64LocatorSize, locator, kZip64LocatorSize);
    if (little(locator, 4) != kZip64LocatorSignature) return l;
    const uint64_t zip64_at = little(locator + 8, 8);
    if (zip64_at > size_ - kZip64EndSize) bad("has its zip64 end record past the end of the file");
    uint8_t z[kZip64EndSize];
    read(zip64_at, z, kZip64EndSize);
    if (little(z, 4) != kZip64EndSignature) return l;
    if (little(z + 4, 8) < kZip64EndSize - 12 || little(locator + 16, 4) != 1)
      bad("has a damaged zip64 end record");
    l = Layout{little(z + 32, 8), little(z + 24, 8), little(z + 16, 4),
               little(z + 20, 4), little(z + 40, 8), little(z + 48, 8)};
    if (l.entries > kAllOnes32 || l.entries_on_disk > kAllOnes32 || l.size > kAllOnes32)
      bad("declares more entries or bytes than a zip reader holds");
    return l;
  }

  struct Entry {
    const uint8_t* name;
    size_t name_size;
    uint64_t uncompressed, length;
  };

  // One central directory entry; its uncompressed size is the zip64 extra field's where the
  // header's is all ones, as mz_zip_file_stat_internal reads it.
  static Entry entry(const uint8_t* p, size_t left, uint64_t index) {
    if (left < kEntrySize || little(p, 4) != kEntrySignature)
      bad("has a damaged entry (number " + std::to_string(index) + ")");
    const size_t name = little(p + 28, 2), extra = little(p + 30, 2), comment = little(p + 32, 2);
    const Entry e{p + kEntrySize, name, little(p + 24, 4), kEntrySize + name + extra + comment};
    if (e.length > left) bad("has an entry longer than the directory (number " + std::to_string(index) + ")");
    if (e.uncompressed != kAllOnes32) return e;
    const uint8_t* field = e.name + name;
    for (size_t rest = extra; rest > 0;) {
      const size_t data = rest >= 4 ? little(field + 2, 2) : rest;
      if (rest < 4 || data + 4 > rest) bad("has a damaged extra field in " + shown(e.name, name));
      if (little(field, 2) == kZip64ExtraField) {
        if (data < 8) bad("has a damaged zip64 field in " + shown(e.name, name));
        return Entry{e.name, name, little(field + 4, 8), e.length};
      }
      field += 4 + data;
      rest -= 4 + data;
    }
    return e;
  }

  // PyTorchStreamReader's constructor takes the folder from entry 0's name and reads these.
  static std::vector<std::string> records_read_on_opening(const Entry& first) {
    const std::string name(reinterpret_cast<const char*>(first.name), first.name_size);
    const std::string folder = name.substr(0, name.find('/'));
    return {folder + "/version", folder + "/.data/version", folder + "/.data/serialization_id"};
  }

  const caffe2::serialize::ReadAdapterInterface& in_;
  uint64_t size_;
};

}  // namespace

void check_zip_directory(const caffe2::serialize::ReadAdapterInterface& archive,
                         std::optional<uint64_t> max_expansion) {
  Directory(archive).check(max_expansion);
}

}  // namespace ampkit::checkpoint_files
