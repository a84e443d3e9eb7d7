// embed-agent: a program that serves its own A2A agent with the installed
// toolnexus server library (toolnexus::server).
//
// The agent is an order desk. "order 3 widgets" is quoted from the catalog
// in the config and the Task parks in input-required, asking for a
// confirmation; "confirm" (or "yes") places the order: the Task completes
// with an "order" artifact (a text part and a data part); "cancel" (or "no")
// rejects it. The quote is saved in the Task itself (the pending request's
// data), so with a persistent store a confirmation reaches a restarted
// process, or another one sharing the store, and still finds the price it was
// quoted.
//
//   usage: embed-agent CONFIG.json
//
// Config (JSON object; every key optional but "catalog"):
//   "listen":      "HOST:PORT"                  default "127.0.0.1:8090"
//   "store":       a selector: "memory", "file:<dir>", "sqlite:<path>", ...
//                  default "memory" (Tasks gone at exit)
//   "plugin_dirs": ["<dir>", ...]               extra plugin directories
//   "name":        the Agent Card's name        default "order-desk"
//   "currency":    "EUR"                        shown with prices
//   "catalog":     {"<item>": <price in cents>, ...}
//
// Prints "listening on http://HOST:PORT/" as its first stdout line; stops on
// SIGINT or SIGTERM (finishing requests, closing the store) and exits 0.
// Exits 2 on a bad command line or config, 1 when the server cannot start.
#include <toolnexus/agent_executor.hpp>
#include <toolnexus/registry.hpp>
#include <toolnexus/server.hpp>

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

/// What the config file says. Plain value type.
struct Config {
  std::string listen = "127.0.0.1:8090";
  std::string store = "memory";
  std::vector<std::string> plugin_dirs;
  std::string name = "order-desk";
  std::string currency = "EUR";
  /// Item name -> unit price in cents (> 0).
  std::map<std::string, int64_t> catalog;
};

/// A config error: what() names the file and the key.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string string_member(const rapidjson::Value &root, const char *key, const std::string &file,
                          const std::string &fallback) {
  auto it = root.FindMember(key);
  if (it == root.MemberEnd()) return fallback;
  if (!it->value.IsString()) throw ConfigError(file + ": \"" + key + "\" must be a string");
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

/// Reads and checks the config file. Throws ConfigError.
Config load_config(const std::string &file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("cannot read the config file " + file);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  rapidjson::Document doc;
  doc.Parse(text.data(), text.size());
  if (doc.HasParseError())
    throw ConfigError(file + " is not valid JSON: " + rapidjson::GetParseError_En(doc.GetParseError()) +
                      " at byte " + std::to_string(doc.GetErrorOffset()));
  if (!doc.IsObject()) throw ConfigError(file + " must hold a JSON object");
  for (auto it = doc.MemberBegin(); it != doc.MemberEnd(); ++it) {
    const std::string key = it->name.GetString();
    static const char *const known[] = {"listen", "store", "plugin_dirs", "name", "currency", "catalog"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char *k) { return key == k; }))
      throw ConfigError(file + ": unknown key \"" + key +
                        "\" (keys: listen, store, plugin_dirs, name, currency, catalog)");
  }
  Config c;
  c.listen = string_member(doc, "listen", file, c.listen);
  c.store = string_member(doc, "store", file, c.store);
  c.name = string_member(doc, "name", file, c.name);
  c.currency = string_member(doc, "currency", file, c.currency);
  if (auto it = doc.FindMember("plugin_dirs"); it != doc.MemberEnd()) {
    if (!it->value.IsArray()) throw ConfigError(file + ": \"plugin_dirs\" must be an array of directories");
    for (const auto &d : it->value.GetArray()) {
      if (!d.IsString()) throw ConfigError(file + ": \"plugin_dirs\" must be an array of directories");
      c.plugin_dirs.emplace_back(d.GetString(), d.GetStringLength());
    }
  }
  auto cat = doc.FindMember("catalog");
  if (cat == doc.MemberEnd() || !cat->value.IsObject() || cat->value.MemberCount() == 0)
    throw ConfigError(file + ": \"catalog\" must be a non-empty object {\"<item>\": <price in cents>}");
  for (auto it = cat->value.MemberBegin(); it != cat->value.MemberEnd(); ++it) {
    std::string item = it->name.GetString();
    std::transform(item.begin(), item.end(), item.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (!it->value.IsInt64() || it->value.GetInt64() <= 0 || it->value.GetInt64() > 100000000)
      throw ConfigError(file + ": catalog." + it->name.GetString() +
                        " must be a price in cents between 1 and 100000000");
    c.catalog[item] = it->value.GetInt64();
  }
  return c;
}

/// "7.50" for 750 cents.
std::string money(int64_t cents) {
  std::string frac = std::to_string(cents % 100);
  if (frac.size() < 2) frac.insert(0, "0");
  return std::to_string(cents / 100) + "." + frac;
}

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::string w;
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (std::isalnum(u) != 0) {
      w.push_back(static_cast<char>(std::tolower(u)));
    } else if (!w.empty()) {
      out.push_back(w);
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(w);
  return out;
}

/// The string member `key` of a JSON object ("" when missing).
std::string text_of(const rapidjson::Value &obj, const char *key) {
  if (!obj.IsObject()) return {};
  auto it = obj.FindMember(key);
  return it != obj.MemberEnd() && it->value.IsString() ? it->value.GetString() : std::string();
}

int64_t int_of(const rapidjson::Value &obj, const char *key) {
  if (!obj.IsObject()) return 0;
  auto it = obj.FindMember(key);
  return it != obj.MemberEnd() && it->value.IsInt64() ? it->value.GetInt64() : 0;
}

/// The order desk. Stateless between calls (everything it needs is in the
/// Task), so thread-safe: execute() runs on several worker threads at once.
class OrderDesk final : public toolnexus::AgentExecutor {
 public:
  explicit OrderDesk(Config config) : config_(std::move(config)) {}

  std::string name() const override { return "order-desk"; }

  std::vector<toolnexus::AgentSkill> skills() const override {
    std::string items;
    for (const auto &kv : config_.catalog) items += (items.empty() ? "" : ", ") + kv.first;
    return {toolnexus::AgentSkill{"order", "Order",
                                  "Quotes an order from the catalog (" + items +
                                      ") and places it once you confirm.",
                                  {"orders", "human-in-the-loop"},
                                  {"order 3 widgets", "confirm", "cancel"}}};
  }

  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    using toolnexus::ExecutionResult;
    if (ctx.pending == nullptr) return quote(ctx.latest_text);
    // A reply to our quote: the quote is in the pending request's data.
    const rapidjson::Value *saved = nullptr;
    if (ctx.pending->IsObject()) {
      auto found = ctx.pending->FindMember("data");
      if (found != ctx.pending->MemberEnd()) saved = &found->value;
    }
    if (saved == nullptr || text_of(*saved, "item").empty() || int_of(*saved, "totalCents") <= 0)
      return ExecutionResult::failed("The saved quote of this Task is missing or damaged; order again.");
    const rapidjson::Value &data = *saved;
    const std::vector<std::string> answer = words(ctx.latest_text);
    const std::string first = answer.empty() ? std::string() : answer.front();
    if (first == "confirm" || first == "yes") return place(data, std::string(ctx.task.id()));
    if (first == "cancel" || first == "no") return ExecutionResult::rejected("Order cancelled; nothing was placed.");
    rapidjson::Document again;
    again.CopyFrom(data, again.GetAllocator());
    return ExecutionResult::input_required("Please reply \"confirm\" or \"cancel\". " + prompt(data),
                                           std::move(again));
  }

 private:
  toolnexus::ExecutionResult quote(std::string_view text) const {
    using toolnexus::ExecutionResult;
    int64_t quantity = 1;
    std::string item;
    for (const std::string &w : words(text)) {
      if (std::all_of(w.begin(), w.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; })) {
        if (w.size() > 4 || std::stoll(w) < 1 || std::stoll(w) > 1000)
          return ExecutionResult::rejected("A quantity must be between 1 and 1000.");
        quantity = std::stoll(w);
      } else if (config_.catalog.count(w) != 0) {
        item = w;
      } else if (w.size() > 1 && w.back() == 's' && config_.catalog.count(w.substr(0, w.size() - 1)) != 0) {
        item = w.substr(0, w.size() - 1);  // "widgets"
      }
    }
    if (item.empty()) {
      std::string items;
      for (const auto &kv : config_.catalog) items += (items.empty() ? "" : ", ") + kv.first;
      return ExecutionResult::rejected("Nothing to order: name an item (" + items +
                                       ") and a quantity, e.g. \"order 3 " + config_.catalog.begin()->first +
                                       "\".");
    }
    const int64_t unit = config_.catalog.at(item);
    // The quote, saved with the prompt in the Task: the confirmation may
    // reach another process, after a restart, or after a price change.
    rapidjson::Document data(rapidjson::kObjectType);
    auto &a = data.GetAllocator();
    data.AddMember("item", rapidjson::Value(item.c_str(), a), a);
    data.AddMember("quantity", quantity, a);
    data.AddMember("unitCents", unit, a);
    data.AddMember("totalCents", unit * quantity, a);
    data.AddMember("currency", rapidjson::Value(config_.currency.c_str(), a), a);
    std::string p = prompt(data);
    return ExecutionResult::input_required(std::move(p), std::move(data));
  }

  static std::string summary(const rapidjson::Value &data) {
    return std::to_string(int_of(data, "quantity")) + " x " + text_of(data, "item") + " = " +
           money(int_of(data, "totalCents")) + " " + text_of(data, "currency");
  }

  static std::string prompt(const rapidjson::Value &data) {
    return "Quote: " + summary(data) + ". Reply \"confirm\" to place the order or \"cancel\".";
  }

  static toolnexus::ExecutionResult place(const rapidjson::Value &data, const std::string &task_id) {
    toolnexus::ExecutionResult r = toolnexus::ExecutionResult::completed("Order placed.");
    // One artifact with a text part and a data part (A2A Artifact, Part).
    auto &a = r.artifacts.GetAllocator();
    rapidjson::Value text(rapidjson::kObjectType);
    text.AddMember("kind", "text", a);
    text.AddMember("text", rapidjson::Value(("Order placed: " + summary(data)).c_str(), a), a);
    rapidjson::Value order(rapidjson::kObjectType);
    order.CopyFrom(data, a);
    order.AddMember("orderId", rapidjson::Value(task_id.c_str(), a), a);
    rapidjson::Value part(rapidjson::kObjectType);
    part.AddMember("kind", "data", a);
    part.AddMember("data", order, a);
    rapidjson::Value parts(rapidjson::kArrayType);
    parts.PushBack(text, a);
    parts.PushBack(part, a);
    rapidjson::Value artifact(rapidjson::kObjectType);
    artifact.AddMember("name", "order", a);
    artifact.AddMember("parts", parts, a);
    r.artifacts.PushBack(artifact, a);
    return r;
  }

  const Config config_;
};

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s CONFIG.json\n", argv[0]);
    return 2;
  }
  Config config;
  try {
    config = load_config(argv[1]);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "embed-agent: %s\n", e.what());
    return 2;
  }
  for (const std::string &d : config.plugin_dirs) toolnexus::PluginRegistry::global().add_directory(d);

  toolnexus::ServerOptions options;
  options.listen = config.listen;
  options.store = config.store;  // a selector; the server opens and closes it
  options.card.name = config.name;
  options.card.description = "Quotes orders and places them once confirmed; Tasks persist in " + config.store;
  options.executor = std::make_shared<OrderDesk>(config);

  // SIGINT/SIGTERM blocked in every thread (the server's inherit the mask)
  // and taken by sigwait() below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::optional<toolnexus::ServerHandle> server;
  try {
    server.emplace(toolnexus::serve(std::move(options)));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "embed-agent: cannot start: %s\n", e.what());
    return 1;
  }
  std::printf("listening on %s\n", server->url().c_str());
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  server->stop();
  return 0;
}
