// SHA-256 on OpenSSL's EVP interface.
#include "ampkit/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <vector>

#include "ampkit/error.h"

namespace ampkit {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1)
    throw Error(ErrorCategory::internal, "OpenSSL SHA-256 initialisation failed");
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::update(const void* data, size_t size) {
  if (size > 0) EVP_DigestUpdate(impl_->ctx, data, size);
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(impl_->ctx, digest, &length);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += digits[digest[i] >> 4];
    out += digits[digest[i] & 15];
  }
  return out;
}

std::string sha256_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(ErrorCategory::internal, "cannot read " + file.string());
  Sha256 h;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    h.update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex();
}

}  // namespace ampkit
