// SHA-256 of bytes and files (OpenSSL), hex-encoded: parameter hashes and checkpoint checksums.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

namespace ampkit {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex();  // finishes the digest

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_file(const std::filesystem::path& file);

}  // namespace ampkit
