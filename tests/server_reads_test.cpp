// Reads served to clients (issue 21): a record a store delivered as sound is
// parsed without the checks the host made before the save
// (Task::parse_stored, TaskRecord::a2a_task_in_place). What the views write
// from it must be byte for byte what they write from a fully validated
// Task::parse, in both dialects and every view; and a store that returns
// broken bytes under a version (it lies, or its disk does) gets them treated
// as unreadable, never served as invalid JSON.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"
#include "wire/dialect.hpp"

#include <rapidjson/error/en.h>

#include <mutex>
#include <set>

using namespace tnxtest;
using toolnexus::server_detail::Dialect;
using toolnexus::server_detail::JsonWriter;
using toolnexus::server_detail::TaskView;

namespace {

// Stored Tasks that exercise what the views transform: every state, both
// timestamp forms, message and status metadata, private metadata beside
// public, file (bytes, uri), data (object, wrapped value) and text parts with
// mediaType, non-ASCII text raw and escaped (a surrogate pair too), escapes
// that must be written again, numbers at full precision, unknown members.
std::vector<std::string> stored_tasks() {
  const std::string msg_user =
      R"({"role":"user","messageId":"m1","kind":"message","parts":[{"kind":"text","text":"héllo \"quoted\"\n\t\\ \u00e9 \ud83d\ude00 😀"}]})";
  const std::string msg_agent =
      R"({"role":"agent","messageId":"m2","kind":"message","taskId":"T","contextId":"c","metadata":{"k":[1,2.5,-3e-7,2.2222222222222223e57]},"parts":[{"kind":"file","file":{"bytes":"aGk=","mimeType":"text/plain","name":"a.txt"}},{"kind":"file","file":{"uri":"https://example.com/x"}},{"kind":"data","data":{"a":{"b":[true,false,null]}},"mediaType":"application/json"},{"kind":"data","data":{"value":[1,2]},"metadata":{"toolnexus.wrappedValue":true,"x":1}},{"kind":"text","text":"md","mediaType":"text/markdown"}],"extensions":["e1"],"referenceTaskIds":[]})";
  std::vector<std::string> out;
  const char *states[] = {"submitted", "working", "input-required", "auth-required", "completed",
                          "canceled",  "failed",  "rejected",       "unknown"};
  int n = 0;
  for (const char *state : states) {
    const std::string id = "T" + std::to_string(n++);
    out.push_back(R"({"id":")" + id + R"(","contextId":"c","kind":"task","status":{"state":")" + state +
                  R"(","timestamp":"2026-03-12T10:00:00.123456Z","message":)" + msg_agent + R"(},"history":[)" +
                  msg_user + "," + msg_agent + "," + msg_user + R"(],"artifacts":[{"artifactId":"a1","name":"n","description":"d","parts":[{"kind":"text","text":"x"}],"metadata":{"m":1}}],"metadata":{"toolnexus/lease":{"owner":"s"},"public":"yes"}})");
  }
  // Members in another order, an offset timestamp, no history, unknown
  // members, only private metadata, empty artifacts.
  out.push_back(
      R"({"status":{"timestamp":"2026-01-31T12:00:00.5+01:30","state":"working"},"x-unknown":{"deep":[[[{}]]]},"contextId":"ctx","id":"U1","artifacts":[],"metadata":{"toolnexus/pending":1}})");
  out.push_back(R"({"id":"U2","contextId":"ctx","status":{"state":"completed"},"history":[],"metadata":null})");
  out.push_back(R"(  {"id":"U3","contextId":"ctx","status":{"state":"failed","timestamp":"1969-12-31T23:59:59.9999Z"}}  )");
  return out;
}

std::vector<TaskView> views() {
  std::vector<TaskView> v(5);
  v[1].history_length = 0;
  v[2].history_length = 1;
  v[3].include_artifacts = false;
  v[4].history_length = 2;
  v[4].include_artifacts = false;
  return v;
}

std::string render(const rapidjson::Value &task, Dialect d, const TaskView &view) {
  rapidjson::StringBuffer b;
  JsonWriter w(b);
  toolnexus::server_detail::write_task(w, task, d, view);
  REQUIRE(w.IsComplete());
  return std::string(b.GetString(), b.GetSize());
}

toolnexus::TaskRecord record(const std::string &json, uint64_t version = 1) {
  toolnexus::TaskRecord r;
  r.json = json;
  r.id = std::string(toolnexus::Task::parse(json).id());
  r.version = version;
  return r;
}

// True when `s` is one JSON text of valid UTF-8 (what a client must get).
bool valid_json(const std::string &s) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseValidateEncodingFlag>(s.data(), s.size());
  return !d.HasParseError();
}

}  // namespace

TEST_CASE("the trusted read writes every view byte for byte as the validated one") {
  for (const std::string &json : stored_tasks()) {
    const toolnexus::Task validated = toolnexus::Task::parse(json);
    REQUIRE(toolnexus::a2a_task_problem(validated).empty());
    const toolnexus::Task trusted = record(json).a2a_task();
    toolnexus::TaskRecord in_place_rec = record(json);
    rapidjson::Document in_place;
    in_place_rec.a2a_task_in_place(in_place);
    for (Dialect d : {Dialect::v0_3, Dialect::v1_0}) {
      for (const TaskView &view : views()) {
        const std::string want = render(validated.json(), d, view);
        CAPTURE(json);
        CAPTURE(toolnexus::server_detail::dialect_name(d));
        CAPTURE(view.history_length);
        CHECK(valid_json(want));
        CHECK(render(trusted.json(), d, view) == want);
        CHECK(render(in_place, d, view) == want);
      }
    }
  }
}

TEST_CASE("a record read in place into a reused allocator, one after the other, as ListTasks does") {
  char buffer[4096];  // small: most records spill into further chunks
  rapidjson::MemoryPoolAllocator<> alloc(buffer, sizeof buffer);
  rapidjson::Document doc(&alloc);
  for (int round = 0; round < 3; ++round) {
    for (const std::string &json : stored_tasks()) {
      doc.SetNull();
      alloc.Clear();
      toolnexus::TaskRecord rec = record(json);
      rec.a2a_task_in_place(doc);
      CHECK(render(doc, Dialect::v1_0, TaskView{}) ==
            render(toolnexus::Task::parse(json).json(), Dialect::v1_0, TaskView{}));
    }
  }
}

namespace {

// A store that returns, under a version as if they were sound, the bytes
// `broken` maps an id to (in get and in list); everything else from a
// memory store.
class LyingStore final : public toolnexus::TaskStore {
 public:
  explicit LyingStore(std::map<std::string, std::string> broken)
      : inner_(toolnexus::resolve_store("memory")), broken_(std::move(broken)) {}
  std::optional<toolnexus::TaskRecord> get(std::string_view id) override {
    auto r = inner_->get(id);
    if (r) lie(*r);
    return r;
  }
  void remove(std::string_view id, uint64_t expected) override { inner_->remove(id, expected); }
  toolnexus::ListPage list(const toolnexus::ListQuery &q) override {
    toolnexus::ListPage p = inner_->list(q);
    for (auto &r : p.records) lie(r);
    return p;
  }
  uint64_t count(const toolnexus::ListQuery &q) override { return inner_->count(q); }
  toolnexus::StoreInfo info() const override { return inner_->info(); }

 protected:
  uint64_t do_save(const toolnexus::TaskRecord &rec, uint64_t expected) override {
    toolnexus::SaveOptions so;
    so.expected_version = expected;
    so.owner = rec.owner;
    so.tenant = rec.tenant;
    return inner_->save(rec.task(), so);
  }

 private:
  void lie(toolnexus::TaskRecord &r) const {
    auto it = broken_.find(r.id);
    if (it != broken_.end() && !r.json.empty()) r.json = it->second;
  }
  std::shared_ptr<toolnexus::TaskStore> inner_;
  std::map<std::string, std::string> broken_;
};

std::string task_json(const std::string &id, const std::string &text) {
  return R"({"id":")" + id + R"(","contextId":"c","kind":"task","status":{"state":"completed","timestamp":"2026-03-12T10:00:00.000000Z"},"history":[{"role":"user","messageId":"m","kind":"message","parts":[{"kind":"text","text":")" +
         text + R"("}]}]})";
}

}  // namespace

TEST_CASE("a store that returns broken bytes as a sound record: unreadable, never invalid output") {
  // What each id's bytes are replaced with when read back.
  const std::map<std::string, std::string> broken = {
      {"utf8", task_json("utf8", "bad \xff\xfe byte")},          // invalid UTF-8
      {"overlong", task_json("overlong", "\xc0\xaf")},           // an overlong '/'
      {"surrogate", task_json("surrogate", "lone \\udc00 low")},  // no character
      {"cut", task_json("cut", "cut").substr(0, 60)},            // not JSON
      {"trailing", task_json("trailing", "x") + "{}"},           // two values
      {"nul", task_json("nul", "x") + std::string(1, '\0') + "garbage"},
      {"deep", R"({"id":"deep","contextId":"c","status":{"state":"completed"},"x":)" + std::string(100000, '[') +
                   std::string(100000, ']') + "}"},
      {"other", task_json("someone-else", "x")},  // the JSON of another Task
      {"no-status", R"({"id":"no-status","contextId":"c"})"},
      // Named twice: the first one counts (as RapidJSON's FindMember reads
      // it), on the fast v0.3 path too (a fuzz finding).
      {"dup-kind", R"({"id":"dup-kind","contextId":"c","kind":"message","kind":"task","status":{"state":"completed"}})"},
      {"dup-status", R"({"id":"dup-status","contextId":"c","status":{},"status":{"state":"completed"}})"},
      {"dup-context", R"({"id":"dup-context","contextId":"","contextId":"c","status":{"state":"completed"}})"},
  };
  auto store = std::make_shared<LyingStore>(broken);
  for (const auto &[id, bytes] : broken) store->save(toolnexus::Task::parse(task_json(id, "fine")));
  for (const char *id : {"good1", "good2"}) store->save(toolnexus::Task::parse(task_json(id, "fine é")));

  auto errors = std::make_shared<std::string>();
  auto mu = std::make_shared<std::mutex>();
  auto o = test_options();
  o.store = store;
  o.log_sink = [errors, mu](toolnexus::LogLevel level, std::string_view line) {
    std::lock_guard<std::mutex> lock(*mu);
    if (level == toolnexus::LogLevel::error) errors->append(line).append("\n");
  };
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string v1 = "A2A-Version: 1.0\r\n";

  for (const auto &[id, bytes] : broken) {
    CAPTURE(id);
    // v1.0, v0.3 with historyLength (the parsing path) and v0.3 without
    // (the stored bytes filtered without a DOM): the same refusal.
    for (const auto &[method, params, headers] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {"GetTask", R"({"id":)" + q(id) + "}", v1},
             {"tasks/get", R"({"id":)" + q(id) + R"(,"historyLength":1})", ""},
             {"tasks/get", R"({"id":)" + q(id) + "}", ""}}) {
      CAPTURE(method);
      CAPTURE(params);
      auto d = c.call(method, params, "1", headers);
      CHECK(valid_json(c.last().body));
      CHECK(error_code(d) == -32603);
      CHECK(error_message(d).find("the task store failed (corrupt)") != std::string::npos);
    }
  }
  for (const std::string &headers : {v1, std::string()}) {
    auto d = c.call(headers.empty() ? "tasks/list" : "ListTasks", R"({"pageSize":100,"historyLength":1})", "1",
                    headers);
    CHECK(valid_json(c.last().body));
    REQUIRE(d.HasMember("result"));
    std::set<std::string> ids;
    for (const auto &t : d["result"]["tasks"].GetArray()) ids.insert(t["id"].GetString());
    CHECK(ids == std::set<std::string>{"good1", "good2"});  // the broken ones left out
    CHECK(d["result"]["totalSize"].GetUint64() == broken.size() + 2);  // the store's count
  }
  std::lock_guard<std::mutex> lock(*mu);
  CHECK(errors->find("stored task 'utf8' is unreadable: task is not valid JSON: bytes that are not UTF-8 at byte") !=
        std::string::npos);
  CHECK(errors->find("stored task 'deep' is unreadable: task JSON nests deeper than 64 levels") != std::string::npos);
  CHECK(errors->find("stored task 'other' holds the JSON of task 'someone-else'") != std::string::npos);
  CHECK(errors->find("stored task 'no-status' is not a valid A2A Task") != std::string::npos);
  CHECK(errors->find("ListTasks left out an unreadable record") != std::string::npos);
}

TEST_CASE("the trust line: a stored timestamp is not checked again, and is served as it is") {
  // Task::parse (every save, `store put`, `store check`) refuses it; a read
  // of a record with a version trusts the store kept what was checked.
  const std::string json = R"({"id":"t","contextId":"c","status":{"state":"completed","timestamp":"yesterday"}})";
  CHECK_THROWS_AS(toolnexus::Task::parse(json), toolnexus::InvalidTask);
  toolnexus::TaskRecord sound;  // as a store delivers it: with a version
  sound.id = "t";
  sound.json = json;
  sound.version = 1;
  const toolnexus::Task t = sound.a2a_task();
  CHECK(t.status_time_us() == toolnexus::kNoTime);
  const std::string v1 = render(t.json(), Dialect::v1_0, TaskView{});
  CHECK(v1 == R"({"id":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED","timestamp":"yesterday"}})");
  // A record without a version (not delivered as sound) gets every check.
  toolnexus::TaskRecord r;
  r.id = "t";
  r.json = json;
  CHECK_THROWS_AS(r.a2a_task(), toolnexus::StoreError);
}
