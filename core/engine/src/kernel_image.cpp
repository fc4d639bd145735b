// Which image of the kernels' fatbin a device loads (kernel_check.h): the fatbin's header read as
// nvcc writes it, and the driver's rules for machine code and PTX, as pure functions (unit-tested
// with every capability CUDA 13 knows and some it does not yet).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ampkit/kernel_check.h"

namespace ampkit {

namespace {

// The fatbin container (fatbinary.h's layout, which cuobjdump reads): a 16-byte header, then
// entries, each a header of at least 64 bytes followed by its payload.
constexpr uint32_t kFatbinMagic = 0xBA55ED50u;
constexpr size_t kFatbinHeader = 16;
constexpr size_t kEntryHeader = 64;
constexpr uint16_t kEntryPtx = 1, kEntryElf = 2;

template <typename T>
T read_at(const unsigned char* data, size_t offset) {
  T value;
  std::memcpy(&value, data + offset, sizeof value);  // little-endian, as every CUDA host is
  return value;
}

}  // namespace

size_t fatbin_size(const unsigned char* data, size_t available) {
  if (data == nullptr || available < kFatbinHeader || read_at<uint32_t>(data, 0) != kFatbinMagic) return 0;
  const uint64_t header = read_at<uint16_t>(data, 6);
  const uint64_t entries = read_at<uint64_t>(data, 8);
  if (header < kFatbinHeader || header > available || entries > available - header) return 0;
  return static_cast<size_t>(header + entries);
}

std::vector<KernelImage> fatbin_images(const unsigned char* data, size_t size) {
  std::vector<KernelImage> images;
  const size_t end = fatbin_size(data, size);
  if (end == 0) return images;
  size_t offset = read_at<uint16_t>(data, 6);
  while (end - offset >= kEntryHeader) {
    const uint16_t kind = read_at<uint16_t>(data, offset);
    const uint64_t header = read_at<uint32_t>(data, offset + 4);
    const uint64_t payload = read_at<uint64_t>(data, offset + 8);
    if (header < kEntryHeader || header > end - offset || payload > end - offset - header) return {};
    if (kind == kEntryPtx || kind == kEntryElf)
      images.push_back({static_cast<int>(read_at<uint32_t>(data, offset + 28)), kind == kEntryPtx});
    offset += static_cast<size_t>(header + payload);
  }
  return images;
}

std::optional<KernelImage> loadable_image(const std::vector<KernelImage>& images, int major, int minor) {
  std::optional<KernelImage> code, ptx;
  const int device = 10 * major + minor;
  for (const KernelImage& image : images) {
    // Machine code runs within its major version on devices of the same or a later minor one.
    if (!image.ptx && image.arch / 10 == major && image.arch % 10 <= minor &&
        (!code || image.arch > code->arch))
      code = image;
    // PTX is compiled by the driver for any device of the same or a later capability.
    if (image.ptx && image.arch <= device && (!ptx || image.arch > ptx->arch)) ptx = image;
  }
  return code ? code : ptx;
}

std::string describe_images(const std::vector<KernelImage>& images) {
  std::string code, ptx;
  for (const KernelImage& image : images) {
    std::string& list = image.ptx ? ptx : code;
    list +=
        (list.empty() ? "" : ", ") + std::string(image.ptx ? "compute_" : "sm_") + std::to_string(image.arch);
  }
  if (code.empty() && ptx.empty()) return "no image";
  return code + (code.empty() || ptx.empty() ? "" : ", ") + (ptx.empty() ? "" : "PTX " + ptx);
}

}  // namespace ampkit
