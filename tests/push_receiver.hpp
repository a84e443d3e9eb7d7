// tests/push_receiver.hpp: a push-notification webhook on loopback for
// tests (Poco's HTTPServer): records every POST it is sent and answers the
// status it is set to. Header-only.
#ifndef TOOLNEXUS_TESTS_PUSH_RECEIVER_HPP
#define TOOLNEXUS_TESTS_PUSH_RECEIVER_HPP

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/StreamCopier.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tnxtest {

/// One POST the webhook got: its headers of interest and body.
struct Received {
  std::string content_type, authorization, token, body;
};

/// A webhook on 127.0.0.1 (`port`, 0: any free one) that records what it is
/// sent, answering `status` (a non-2xx answer records nothing). Thread-safe;
/// stops on destruction.
class Receiver {
 public:
  explicit Receiver(uint16_t port = 0) {
    socket_ = Poco::Net::ServerSocket(Poco::Net::SocketAddress("127.0.0.1", port), 64);
    auto *params = new Poco::Net::HTTPServerParams;
    params->setMaxThreads(4);
    server_ = std::make_unique<Poco::Net::HTTPServer>(new Factory(*this), socket_, params);
    server_->start();
  }
  ~Receiver() { server_->stopAll(true); }
  uint16_t port() const { return socket_.address().port(); }
  std::string url(const std::string &path = "/hook") const {
    return "http://127.0.0.1:" + std::to_string(port()) + path;
  }
  std::vector<Received> got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }
  std::atomic<int> status{200};

 private:
  struct Handler final : Poco::Net::HTTPRequestHandler {
    explicit Handler(Receiver &r) : r_(r) {}
    void handleRequest(Poco::Net::HTTPServerRequest &req, Poco::Net::HTTPServerResponse &resp) override {
      Received x;
      x.content_type = req.getContentType();
      x.authorization = req.get("Authorization", "");
      x.token = req.get("X-A2A-Notification-Token", "");
      Poco::StreamCopier::copyToString(req.stream(), x.body);
      const int st = r_.status.load();
      if (st >= 200 && st < 300) {
        std::lock_guard<std::mutex> lock(r_.mu_);
        r_.got_.push_back(std::move(x));
      }
      resp.setStatus(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(st));
      resp.setContentLength(0);
      resp.send();
    }
    Receiver &r_;
  };
  struct Factory final : Poco::Net::HTTPRequestHandlerFactory {
    explicit Factory(Receiver &r) : r_(r) {}
    Poco::Net::HTTPRequestHandler *createRequestHandler(const Poco::Net::HTTPServerRequest &) override {
      return new Handler(r_);
    }
    Receiver &r_;
  };
  Poco::Net::ServerSocket socket_;
  std::unique_ptr<Poco::Net::HTTPServer> server_;
  std::mutex mu_;
  std::vector<Received> got_;
};

}  // namespace tnxtest

#endif
