// Push targets (SSRF, issue 19 item 7): every IPv6 form that embeds or maps
// an IPv4 address is judged by that address, and the IANA IPv4/IPv6
// special-purpose registries decide what is refused (what they say is not
// globally reachable), through CreateTaskPushNotificationConfig as a client
// calls it, with literal addresses (no DNS).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

using namespace tnxtest;

namespace {

struct Case {
  const char *host;  // as in the URL (IPv6 in brackets)
  const char *why;   // "" = accepted; else a part of the refusal's reason
};

const Case kCases[] = {
    // IPv4: the special-purpose registry, most specific row deciding.
    {"127.0.0.1", ", a loopback address (RFC 1122"},
    {"10.1.2.3", ", a private-use address (RFC 1918)"},
    {"0.0.0.0", "this host on this network"},
    {"100.64.0.1", "carrier-grade NAT"},
    {"192.0.0.8", "IPv4 dummy address (RFC 7600)"},
    {"192.0.0.170", "NAT64/DNS64 discovery"},
    {"192.88.99.1", "deprecated 6to4 relay anycast address (RFC 7526)"},
    {"255.255.255.255", "limited broadcast"},
    {"224.0.0.1", "multicast"},
    {"192.0.0.9", ""},     // PCP anycast: globally reachable (RFC 7723)
    {"192.31.196.1", ""},  // AS112-v4 (RFC 7535)
    {"8.8.8.8", ""},
    // IPv6: the special-purpose registry.
    {"[::1]", ", a loopback address (RFC 4291)"},
    {"[::]", "unspecified"},
    {"[fd00::1]", "unique-local"},
    {"[fe80::1]", "link-local"},
    {"[fec0::1]", "site-local"},
    {"[ff02::1]", "multicast"},
    {"[2001:db8::1]", "documentation address (RFC 3849)"},
    {"[3fff::1]", "documentation address (RFC 9637)"},
    {"[100::1]", "discard-only address (RFC 6666)"},
    {"[2001:2::1]", "benchmarking address (RFC 5180)"},
    {"[2001:10::1]", "deprecated ORCHID"},
    {"[5f00::1]", "segment routing"},
    {"[4000::1]", "outside global unicast"},
    {"[64:ff9b:1::a00:1]", "local-use IPv4/IPv6 translation address (RFC 8215)"},
    {"[2001:1::1]", ""},  // PCP anycast (RFC 7723)
    {"[2606:4700::1111]", ""},
    // IPv6 forms that carry an IPv4 address: judged by it.
    {"[::ffff:127.0.0.1]", "embedding 127.0.0.1 (IPv4-mapped"},
    {"[::ffff:169.254.169.254]", "embedding 169.254.169.254 (IPv4-mapped"},
    {"[::127.0.0.1]", "embedding 127.0.0.1 (IPv4-compatible"},
    {"[::10.0.0.1]", "embedding 10.0.0.1 (IPv4-compatible"},
    {"[::ffff:0:10.0.0.1]", "embedding 10.0.0.1 (IPv4-translated"},
    {"[64:ff9b::10.0.0.1]", "embedding 10.0.0.1 (NAT64"},
    {"[64:ff9b::127.0.0.1]", "embedding 127.0.0.1 (NAT64"},
    {"[2002:a00:1::1]", "embedding 10.0.0.1 (6to4"},
    {"[2002:7f00:1::]", "embedding 127.0.0.1 (6to4"},
    {"[2001:0:4136:e378:8000:63bf:f5ff:fffe]", "embedding 10.0.0.1 (Teredo client"},
    {"[2001:0:4136:e378:8000:63bf:80ff:fffe]", "embedding 127.0.0.1 (Teredo client"},
    {"[2001:4860::5efe:10.0.0.1]", "embedding 10.0.0.1 (ISATAP"},
    {"[2001:4860::200:5efe:192.168.1.1]", "embedding 192.168.1.1 (ISATAP"},
    {"[fe80::5efe:8.8.8.8]", "link-local"},
    {"[::ffff:8.8.8.8]", ""},
    {"[64:ff9b::8.8.8.8]", ""},
    {"[2002:808:808::1]", ""},
    {"[2001:0:4136:e378:8000:63bf:f7f7:f7f7]", ""},  // Teredo client 8.8.8.8
    {"[2001:4860::200:5efe:8.8.8.8]", ""},
};

// Sets a config with `host` on a parked Task; the JSON-RPC answer.
rapidjson::Document set_config(Client &c, const std::string &task, const std::string &host) {
  return c.call("CreateTaskPushNotificationConfig",
                R"({"taskId":)" + q(task) + R"(,"url":"http://)" + host + R"(:8080/hook"})", "1", "A2A-Version: 1.0\r\n");
}

}  // namespace

TEST_CASE("push targets: the IANA special-purpose registries decide, IPv4 carried in IPv6 is judged as IPv4") {
  auto o = test_options();
  o.agent = "approval";
  o.push.max_configs_per_task = 1000;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string task = task_id(c.send("park"));
  c.wait_settled(task);
  for (const Case &k : kCases) {
    const std::string host = k.host;
    CAPTURE(host);
    auto r = set_config(c, task, host);
    if (*k.why == '\0') {
      CHECK_MESSAGE(r.HasMember("result"), error_message(r));
    } else {
      CHECK(error_code(r) == -32602);
      CHECK_MESSAGE(error_message(r).find(k.why) != std::string::npos, error_message(r));
      CHECK(error_message(r).find("push.allow_targets") != std::string::npos);
    }
  }
}

TEST_CASE("push targets: an allowed range allows the IPv6 forms that carry its IPv4 addresses") {
  auto o = test_options();
  o.agent = "approval";
  o.push.allow_targets = {"10.0.0.0/8", "2001:db8::/32"};
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string task = task_id(c.send("park"));
  c.wait_settled(task);
  for (const std::string ok : {"10.1.2.3", "[::ffff:10.0.0.1]", "[::10.0.0.1]", "[2002:a00:1::1]",
                         "[2001:0:4136:e378:8000:63bf:f5ff:fffe]", "[2001:db8::1]"}) {
    CAPTURE(ok);
    auto r = set_config(c, task, ok);
    CHECK_MESSAGE(r.HasMember("result"), error_message(r));
  }
  for (const std::string no : {"[::ffff:127.0.0.1]", "[2002:c0a8:101::1]", "[fe80::5efe:10.0.0.1]"}) {
    CAPTURE(no);
    CHECK(error_code(set_config(c, task, no)) == -32602);
  }
}
