#include "free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ampkit::test {

namespace {

constexpr int kFirst = 20000;
constexpr int kCount = 12000;  // 20000-31999: below Linux's ephemeral range

bool bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_port: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int free_port() {
  static int next = static_cast<int>(::getpid() % 1200) * 10;
  for (int tried = 0; tried < kCount; ++tried) {
    const int port = kFirst + (next++ % kCount);
    if (bindable(port)) return port;
  }
  throw std::runtime_error("free_port: no free TCP port in 20000-31999");
}

}  // namespace ampkit::test
