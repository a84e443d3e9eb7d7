// The Task value type: parsing (where a Task enters the system), validation,
// serialisation, timestamps, UTF-8.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "toolnexus/task.hpp"
#include "toolnexus/task_store.hpp"

#include <string>

using namespace toolnexus;

namespace {
std::string why(std::string_view json) {
  try {
    Task::parse(json);
  } catch (const InvalidTask &e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("parse keeps every field and member order") {
  const std::string json =
      R"({"zeta":1,"id":"t1","contextId":"c","status":{"state":"working","timestamp":"2026-01-02T03:04:05Z"},"x":{"y":[1,"two",null]},"kind":"task"})";
  Task t = Task::parse(json);
  CHECK(t.to_json() == json);
  CHECK(t.id() == "t1");
  CHECK(t.context_id() == "c");
  CHECK(t.state() == "working");
  CHECK(t.status_time_us() == 1767323045LL * 1000000LL);
}

TEST_CASE("invalid Tasks are refused with the reason") {
  CHECK(why("").find("not valid JSON") != std::string::npos);
  CHECK(why("{\"id\":\"a\"").find("at byte 9") != std::string::npos);
  CHECK(why("[]") == "task must be a JSON object");
  CHECK(why("{}") == "task has no \"id\"");
  CHECK(why(R"({"id":7})") == "task \"id\" must be a string");
  CHECK(why(R"({"id":""})") == "task \"id\" must not be empty");
  CHECK(why(R"({"id":"a\u0000b"})") == "task \"id\" must not contain NUL");
  CHECK(why(R"({"id":"a","contextId":1})") == "task \"contextId\" must be a string");
  CHECK(why(R"({"id":"a","status":"done"})") == "task \"status\" must be an object");
  CHECK(why(R"({"id":"a","status":{"state":3}})") == "task \"status.state\" must be a string");
  CHECK(why(R"({"id":"a","status":{"state":"bogus"}})").find("'bogus' is not a TaskState") != std::string::npos);
  CHECK(why(R"({"id":"a","status":{"state":"TASK_STATE_WORKING"}})").find("is not a TaskState") != std::string::npos);
  CHECK(why(R"({"id":"a","status":{"timestamp":"yesterday"}})").find("RFC 3339") != std::string::npos);
  CHECK(why(R"({"id":"a"} x)").find("not valid JSON") != std::string::npos);
  CHECK(why("{\"id\":\"\xff\"}").find("not valid JSON") != std::string::npos);
}

TEST_CASE("nesting deeper than the limit is refused without recursion") {
  std::string deep = "{\"id\":\"d\",\"x\":";
  for (int i = 0; i < 10000; ++i) deep += '[';
  for (int i = 0; i < 10000; ++i) deep += ']';
  deep += '}';
  CHECK(why(deep).find("nests deeper than 64") != std::string::npos);
  std::string ok = "{\"id\":\"d\",\"x\":";
  for (int i = 0; i < 63; ++i) ok += '[';
  for (int i = 0; i < 63; ++i) ok += ']';
  ok += '}';
  CHECK(why(ok).empty());
  // Brackets inside strings do not count.
  CHECK(why("{\"id\":\"" + std::string(100, '[') + "\"}").empty());
}

TEST_CASE("parse refuses a lone surrogate escape, which is no character (found by fuzz/task_parse_fuzz)") {
  // RapidJSON decodes "\udddd" alone into bytes that are not UTF-8; parse()
  // took them, and to_json() then refused the Task it had accepted.
  for (const char *json : {R"({"id":"\udddd"})", R"({"id":"a","x":["\uDC00"]})", R"({"id":"a","\udfff":1})"}) {
    CAPTURE(json);
    CHECK_THROWS_WITH_AS(Task::parse(json),
                         doctest::Contains("a \\u escape of a lone surrogate (U+D800..U+DFFF)"), InvalidTask);
  }
  // A surrogate pair is one character, and an escaped backslash before "u"
  // is no escape.
  const Task pair = Task::parse(R"({"id":"\ud83d\ude00","t":"\\udc00"})");
  CHECK(pair.id() == "\xf0\x9f\x98\x80");
  CHECK(pair.to_json() == "{\"id\":\"\xf0\x9f\x98\x80\",\"t\":\"\\\\udc00\"}");
}

TEST_CASE("a number survives save and load unchanged (found by fuzz/task_parse_fuzz)") {
  // RapidJSON's default number parsing is not exact: 2.222222222222222e57
  // was written back as another double, which the next load read as a third.
  const Task t = Task::parse(R"({"id":"a","x":[2.222222222222222e57,0.1,1e-300]})");
  const std::string once = t.to_json();
  CHECK(once == R"({"id":"a","x":[2.222222222222222e57,0.1,1e-300]})");
  CHECK(Task::parse(once).to_json() == once);
}

TEST_CASE("to_json refuses invalid UTF-8 put in by code") {
  Task t = Task::parse(R"({"id":"a"})");
  t.json().AddMember("bad", rapidjson::Value("\xc3\x28", t.allocator()), t.allocator());
  CHECK_THROWS_AS(t.to_json(), InvalidTask);
}

TEST_CASE("to_json refuses to write what parse would refuse: nesting too deep") {
  Task t = Task::parse(R"({"id":"a"})");
  rapidjson::Value v(rapidjson::kArrayType);
  for (int i = 0; i < 70; ++i) {
    rapidjson::Value outer(rapidjson::kArrayType);
    outer.PushBack(v, t.allocator());
    v = outer;
  }
  t.json().AddMember("deep", v, t.allocator());
  CHECK_THROWS_WITH_AS(t.to_json(), "task JSON nests deeper than 64 levels", InvalidTask);
}

TEST_CASE("set_status replaces the status and stamps the time") {
  Task t = Task::parse(R"({"id":"a","status":{"state":"submitted","extra":1}})");
  rapidjson::Value msg(rapidjson::kObjectType);
  msg.AddMember("role", "agent", t.allocator());
  t.set_status(task_state::kInputRequired, std::move(msg), 1767225600LL * 1000000LL + 5);
  CHECK(t.state() == "input-required");
  CHECK(t.status_time_us() == 1767225600LL * 1000000LL + 5);
  CHECK(t.to_json() ==
        R"({"id":"a","status":{"state":"input-required","message":{"role":"agent"},"timestamp":"2026-01-01T00:00:00.000005Z"}})");
  int64_t before = now_us();
  t.set_status(task_state::kWorking);
  CHECK(t.status_time_us() >= before - 1);
  CHECK(t.json()["status"].HasMember("message") == false);
}

TEST_CASE("RFC 3339 timestamps") {
  int64_t us = 0;
  CHECK(parse_timestamp("1970-01-01T00:00:00Z", us));
  CHECK(us == 0);
  CHECK(parse_timestamp("2026-11-29T20:58:33.5Z", us));
  CHECK(us == 1795985913500000LL);
  CHECK(parse_timestamp("2026-11-29T21:58:33.5+01:00", us));
  CHECK(us == 1795985913500000LL);
  CHECK(parse_timestamp("2026-11-29T20:58:33.123456789Z", us));
  CHECK(us == 1795985913123456LL);
  CHECK(parse_timestamp("2026-11-29t20:58:33z", us));
  CHECK_FALSE(parse_timestamp("2026-11-29", us));
  CHECK_FALSE(parse_timestamp("2026-11-29T20:58:33", us));  // no zone
  CHECK_FALSE(parse_timestamp("2026-13-29T20:58:33Z", us));
  CHECK_FALSE(parse_timestamp("2026-02-30T20:58:33Z", us));
  CHECK_FALSE(parse_timestamp("2026-11-29T25:58:33Z", us));
  CHECK_FALSE(parse_timestamp("2026-11-29T20:58:33.Z", us));
  CHECK_FALSE(parse_timestamp("2026-11-29T20:58:33Zjunk", us));
  CHECK(format_timestamp(1795985913123456LL) == "2026-11-29T20:58:33.123456Z");
  CHECK(format_timestamp(0) == "1970-01-01T00:00:00.000000Z");
  CHECK(format_timestamp(-1) == "1969-12-31T23:59:59.999999Z");
  CHECK(format_timestamp(1709208000000001LL) == "2024-02-29T12:00:00.000001Z");  // leap day
  CHECK(format_timestamp(951825600000000LL) == "2000-02-29T12:00:00.000000Z");   // 400-year leap day
  CHECK(format_timestamp(253402300799999999LL) == "9999-12-31T23:59:59.999999Z");
  CHECK(format_timestamp(-62135596800000000LL) == "0001-01-01T00:00:00.000000Z");
  // Year 0000 is RFC 3339; the years around it are not, yet parse_timestamp
  // reaches them through an offset: ECMAScript's expanded years, sign and six
  // digits (Poco's formatter wrote "-001-12-31T-23:-00:-00.000000Z" here).
  CHECK(format_timestamp(-62167219200000000LL) == "0000-01-01T00:00:00.000000Z");
  REQUIRE(parse_timestamp("0000-01-01T00:00:00+01:00", us));
  CHECK(format_timestamp(us) == "-000001-12-31T23:00:00.000000Z");
  REQUIRE(parse_timestamp("9999-12-31T23:30:00.5-01:00", us));
  CHECK(format_timestamp(us) == "+010000-01-01T00:30:00.500000Z");
  CHECK(format_timestamp(INT64_MIN) == "-290308-12-21T19:59:05.224192Z");
  CHECK(format_timestamp(INT64_MAX) == "+294247-01-10T04:00:54.775807Z");
}

TEST_CASE("format_timestamp and parse_timestamp round-trip over years 0001..9999") {
  // A linear congruential walk over the whole RFC 3339 range, negative
  // (before 1970) and positive, down to the microsecond.
  const int64_t lo = -62135596800000000LL, hi = 253402300799999999LL;
  uint64_t x = 88172645463325252ULL;
  for (int i = 0; i < 20000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const int64_t t = lo + static_cast<int64_t>(x % static_cast<uint64_t>(hi - lo));
    const std::string text = format_timestamp(t);
    int64_t back = 0;
    CAPTURE(t);
    CAPTURE(text);
    REQUIRE(text.size() == 27);
    REQUIRE(parse_timestamp(text, back));
    REQUIRE(back == t);
  }
}

TEST_CASE("UTF-8 validation") {
  CHECK(is_valid_utf8(""));
  CHECK(is_valid_utf8("plain"));
  CHECK(is_valid_utf8("\xc3\xbc \xe6\x97\xa5 \xf0\x9f\x98\x80"));
  CHECK_FALSE(is_valid_utf8("\xff"));
  CHECK_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  CHECK_FALSE(is_valid_utf8("\xe6\x97"));          // truncated
}

TEST_CASE("task states") {
  for (auto s : {"completed", "canceled", "failed", "rejected"}) CHECK(task_state::is_terminal(s));
  for (auto s : {"submitted", "working", "input-required", "auth-required", "unknown"})
    CHECK_FALSE(task_state::is_terminal(s));
  CHECK(task_state::is_interrupted("input-required"));
  CHECK(task_state::is_interrupted("auth-required"));
  CHECK_FALSE(task_state::is_interrupted("working"));
  CHECK(task_state::is_known("rejected"));
  CHECK_FALSE(task_state::is_known("TASK_STATE_WORKING"));
}

TEST_CASE("a record holding another Task's JSON is corrupt, never served as this one") {
  TaskRecord r;
  r.id = "idmis";
  r.json = R"({"id":"zzz"})";
  try {
    r.task();
    FAIL("no throw");
  } catch (const StoreError &e) {
    CHECK(e.code() == Status::corrupt);
    CHECK(std::string(e.what()) == "stored task 'idmis' holds the JSON of task 'zzz'");
  }
}

TEST_CASE("a corrupt stored record is reported as corrupt, naming the id") {
  TaskRecord r;
  r.id = "broken";
  r.json = "{\"id\":";
  try {
    r.task();
    FAIL("no throw");
  } catch (const StoreError &e) {
    CHECK(e.code() == Status::corrupt);
    CHECK(std::string(e.what()).find("'broken'") != std::string::npos);
  }
}

TEST_CASE("is_valid_utf8: a lone byte of a byte order mark is no character, at the start too") {
  // RapidJSON's EncodedInputStream skipped EF, BB and BF at the start.
  CHECK_FALSE(is_valid_utf8("\xbb"));
  CHECK_FALSE(is_valid_utf8("\xbf tail"));
  CHECK_FALSE(is_valid_utf8("\xef"));
  CHECK_FALSE(is_valid_utf8("a\xbb"));
  CHECK(is_valid_utf8("\xef\xbb\xbf"));  // U+FEFF itself is a character
}

TEST_CASE("is_valid_utf8 finds a bad byte wherever it is among ASCII runs (the word-at-a-time scan)") {
  const std::string good = "é😀€";  // 2, 4 and 3 byte sequences
  for (std::size_t at = 0; at < 20; ++at) {
    std::string s(20, 'a');
    CHECK(is_valid_utf8(s.substr(0, at)));
    std::string with_good = s;
    with_good.insert(at, good);
    CHECK(is_valid_utf8(with_good));
    std::string bad = s;
    bad[at] = '\xff';
    CHECK(!is_valid_utf8(bad));
    std::string cut = s.substr(0, at) + good.substr(0, 3);  // a sequence cut short
    CHECK(!is_valid_utf8(cut));
    std::string overlong = s;
    overlong.insert(at, "\xc0\xaf");
    CHECK(!is_valid_utf8(overlong));
    std::string surrogate = s;
    surrogate.insert(at, "\xed\xa0\x80");  // U+D800 encoded
    CHECK(!is_valid_utf8(surrogate));
  }
}

namespace {
std::string why_stored(std::string_view json) {
  try {
    Task::parse_stored(json);
  } catch (const InvalidTask &e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("parse_stored: what parse accepts, the same Task; what would make invalid output, refused naming where") {
  for (const std::string &json : {
           std::string(R"({"zeta":1,"id":"t1","contextId":"c","status":{"state":"working","timestamp":"2026-01-02T03:04:05Z"},"x":{"y":[1,"two",null,2.2222222222222223e57,-0.0]},"kind":"task"})"),
           std::string(R"( {"id":"t\u00e9\ud83d\ude00","t":"é \" \\ \n"} )"),
       }) {
    CAPTURE(json);
    CHECK(Task::parse_stored(json).to_json() == Task::parse(json).to_json());
  }
  const std::string deep64 = R"({"id":"t","x":)" + std::string(63, '[') + std::string(63, ']') + "}";
  CHECK(Task::parse_stored(deep64).to_json() == Task::parse(deep64).to_json());

  CHECK(why_stored("{\"id\":\"t\",\"s\":\"a\xff\"}") == "task is not valid JSON: bytes that are not UTF-8 at byte 16");
  CHECK(why_stored(R"({"id":"t","s":"\udc00"})").find("lone surrogate") != std::string::npos);
  CHECK(why_stored(R"({"id":"t","x":)" + std::string(64, '[') + std::string(64, ']') + "}") ==
        "task JSON nests deeper than 64 levels");
  CHECK(why_stored(R"({"id":"t","x":)" + std::string(1000000, '[')) == "task JSON nests deeper than 64 levels");
  CHECK(why_stored(R"({"id":"t"})" + std::string("{}")) == "task is not valid JSON: bytes after the value at byte 10");
  CHECK(why_stored(std::string(R"({"id":"t"})") + '\0' + "x") ==
        "task is not valid JSON: bytes after the value at byte 10");
  CHECK(why_stored(R"({"id":"t")").find("task is not valid JSON: ") == 0);
  CHECK(why_stored(R"({"id":""})") == "task \"id\" must not be empty");
  CHECK(why_stored(R"({"id":"t","status":{"state":"done"}})").find("is not a TaskState") != std::string::npos);
  // The trust line: the timestamp is the one rule not checked again.
  CHECK(why(R"({"id":"t","status":{"timestamp":"soon"}})").find("RFC 3339") != std::string::npos);
  CHECK(why_stored(R"({"id":"t","status":{"timestamp":"soon"}})").empty());
}

TEST_CASE("a2a_task of a record with a version: the stored-read checks, and the same errors") {
  TaskRecord r;
  r.id = "t";
  r.version = 3;
  r.json = R"({"id":"t","contextId":"c","status":{"state":"completed"}})";
  CHECK(r.a2a_task().to_json() == r.json);
  rapidjson::Document doc;
  TaskRecord in_place = r;
  in_place.a2a_task_in_place(doc);
  CHECK(doc["contextId"] == "c");
  const auto corrupt = [](TaskRecord rec) {
    try {
      (void)rec.a2a_task();
    } catch (const StoreError &e) {
      CHECK(e.code() == Status::corrupt);
      std::string first = e.what();
      rapidjson::Document d;
      try {
        rec.a2a_task_in_place(d);
      } catch (const StoreError &e2) {
        CHECK(std::string(e2.what()) == first);
        return first;
      }
      FAIL("a2a_task_in_place took what a2a_task refused");
    }
    return std::string();
  };
  TaskRecord other = r;
  other.json = R"({"id":"u","contextId":"c","status":{"state":"completed"}})";
  CHECK(corrupt(other) == "stored task 't' holds the JSON of task 'u'");
  TaskRecord bad = r;
  bad.json = "{\"id\":\"t\",\"contextId\":\"c\xc3\"}";
  CHECK(corrupt(bad) == "stored task 't' is unreadable: task is not valid JSON: bytes that are not UTF-8 at byte 24");
  TaskRecord partial = r;
  partial.json = R"({"id":"t"})";
  CHECK(corrupt(partial).find("stored task 't' is not a valid A2A Task: \"contextId\" is required") == 0);
  TaskRecord flagged = r;
  flagged.problem = "CRC mismatch";
  CHECK(corrupt(flagged) == "stored task 't' is unreadable: CRC mismatch");
}

TEST_CASE("parse_timestamp: the arithmetic path gives what Poco's parser gave (values from Poco 1.12)") {
  const std::pair<const char *, int64_t> known[] = {
      {"1970-01-01T00:00:00Z", 0},
      {"2026-11-29T20:58:33.5Z", 1795985913500000},
      {"2026-11-29T20:58:33.123456789Z", 1795985913123456},  // a fraction cut to microseconds
      {"2026-11-29t20:58:33.12+01:30", 1795980513120000},
      {"1000-01-01T00:00:00Z", -30610224000000000},  // proleptic Gregorian
      {"0000-01-01T00:00:00z", -62167219200000000},
      {"2024-02-29T23:59:59.999999-00:01", 1709251259999999},
      {"2026-11-29T20:58:60Z", 1795985940000000},  // a leap second: Poco's path, as before
  };
  for (const auto &[text, us] : known) {
    CAPTURE(text);
    int64_t got = 0;
    CHECK(parse_timestamp(text, got));
    CHECK(got == us);
  }
  int64_t ignored = 0;
  for (const char *bad : {"2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z",
                          "2026-01-00T00:00:00Z"}) {
    CAPTURE(std::string(bad));
    CHECK_FALSE(parse_timestamp(bad, ignored));
  }
}
