// plugins/file/basics.cpp: see basics.hpp.
#include "basics.hpp"

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>

#include <cerrno>
#include <system_error>

namespace toolnexus::file_plugin {

std::string errtext(int e) { return std::error_code(e, std::generic_category()).message(); }

std::string sha256_hex(std::string_view data) {
  Poco::SHA2Engine engine(Poco::SHA2Engine::SHA_256);
  engine.update(data.data(), data.size());
  return Poco::DigestEngine::digestToHex(engine.digest());
}

void write_all_fd(int fd, std::string_view data, const std::string &what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(TNX_EIO, "cannot write '" + what + "': " + errtext(errno));
    }
    if (n == 0) throw Error(TNX_EIO, "cannot write '" + what + "': no progress");
    done += static_cast<size_t>(n);
  }
}

}  // namespace toolnexus::file_plugin
