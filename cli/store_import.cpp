// cli/store_import.cpp: `toolnexus store put` of JSON lines (issue 21):
// the input is read, checked and saved as a stream through the store's
// save_stream (ABI 1.5), so memory stays that of a few Tasks whatever its
// size: in one transaction where the store has them (sqlite, postgres,
// memory), else Task by Task with grouped fsyncs (file:), which --resume
// finishes after a failure or a crash.
#include "store_common.hpp"

#include <iostream>
#include <memory>
#include <vector>

namespace toolnexus::cli::store_detail {
namespace {

// One line of a JSON-lines put, parsed and checked.
struct PutLine {
  Task task;
  size_t line = 0;
  // The messageId of the status message --running-as gave it; "" when the
  // Task is saved as the line has it.
  std::string import_id;
};

// Thrown by a put's source to stop the save; the reason was printed.
struct PutStopped {
  int exit_code;
};

// The lines of a JSON-lines put, read and checked one at a time. A bad
// line is reported (its number and why); from the first one on, nothing
// more is handed out, but every later line is still read and checked, so
// that one run names every bad line.
class PutLines {
 public:
  PutLines(const Options &o, LineReader &in) : o_(o), in_(in) {}

  // The next sound line into `out`; false at the end or after a bad line.
  bool next(PutLine &out) {
    if (bad_ != 0) return false;
    if (!in_.next(text_, no_)) return false;
    const std::string why = check(out.task, out.import_id);
    if (why.empty()) {
      out.line = no_;
      return true;
    }
    report(why);
    first_bad_ = no_;
    Task t;
    std::string id;
    while (in_.next(text_, no_)) {
      const std::string w = check(t, id);
      if (!w.empty()) report(w);
    }
    return false;
  }
  // How many lines were bad, and the number of the first.
  size_t bad() const { return bad_; }
  size_t first_bad() const { return first_bad_; }

 private:
  std::string check(Task &t, std::string &import_id) {
    import_id.clear();
    std::string why = parse_a2a_task(text_, t);
    if (why.empty()) why = running_as(o_, t, text_, &import_id);
    return why;
  }
  void report(const std::string &why) {
    ++bad_;
    std::cerr << "toolnexus store put: line " << no_ << ": " << why << "\n";
  }

  const Options &o_;
  LineReader &in_;
  std::string text_;
  size_t no_ = 0, bad_ = 0, first_bad_ = 0;
};

// Whether `store` holds the Task of `pl` as a put with `so` saves it: what
// --resume skips. The bytes must be the same (the store keeps a saved
// Task's bytes as given); a Task --running-as changed is known by the
// messageId of its import message (its status timestamp is the import's).
bool already_stored(TaskStore &store, const PutLine &pl, const SaveOptions &so) {
  const std::optional<TaskRecord> r = store.get(pl.task.id());
  if (!r || r->owner != so.owner || r->tenant != so.tenant) return false;
  if (pl.import_id.empty()) return r->json == pl.task.to_json();
  try {
    const Task stored = Task::parse(r->json);
    const auto &doc = stored.json();
    const auto status = doc.FindMember("status");
    if (status == doc.MemberEnd() || !status->value.IsObject()) return false;
    const auto msg = status->value.FindMember("message");
    if (msg == status->value.MemberEnd() || !msg->value.IsObject()) return false;
    const auto mid = msg->value.FindMember("messageId");
    return mid != msg->value.MemberEnd() && mid->value.IsString() && pl.import_id == mid->value.GetString();
  } catch (const std::exception &) {
    return false;
  }
}

// The line and Task id of the last kSpan items a put handed to the store,
// by their index: what a BatchError's index() is reported as.
class HandedOut {
 public:
  void note(uint64_t index, size_t line, std::string_view id) {
    Slot &s = slots_[index % kSpan];
    s.index = index;
    s.line = line;
    s.id.assign(id);
  }
  // "line 12 (Task 'x')", or "Task number 7 of the input" when forgotten.
  std::string where(uint64_t index) const {
    const Slot &s = slots_[index % kSpan];
    if (s.index != index || s.line == 0) return "Task number " + std::to_string(index + 1) + " of the input";
    return "line " + std::to_string(s.line) + " (Task '" + printable(s.id) + "')";
  }

 private:
  static constexpr size_t kSpan = 4096;
  struct Slot {
    uint64_t index = 0;
    size_t line = 0;
    std::string id;
  };
  std::vector<Slot> slots_ = std::vector<Slot>(kSpan);
};

// Why a put's save of the item at `where` failed, for stderr.
std::string put_failure(const std::string &where, const StoreError &e) {
  return "toolnexus store put: " + where + ": " +
         (e.code() == Status::conflict
              ? std::string("a Task with this id exists (use --force to replace it; --resume skips Tasks "
                            "stored as the input has them)")
              : std::string(e.what()));
}

// The SaveOptions of a put's line: a new Task, or with --force whatever is
// stored, keeping owner and tenant not given (`current`, when --force).
SaveOptions line_options(const Options &o, const Task &t, const std::optional<TaskRecord> &current) {
  SaveOptions so = put_options(o, t, current);
  so.expected_version = o.flag("--force") ? kAnyVersion : kNoVersion;
  return so;
}

// A JSON-lines put into a store with transactions: one save_stream over
// the whole input, each line checked as it is read; a bad line (and every
// later one, reported too) or a failing save rolls everything back.
// Returns the exit code, or nullopt when the store has no transactions
// (nothing of `in` read then).
std::optional<int> put_in_one_transaction(const Options &o, TaskStore &s, LineReader &in) {
  const std::string &sel = o.positional[1];
  const bool force = o.flag("--force"), resume = o.flag("--resume");
  std::shared_ptr<TaskStore> peek;  // gets for --force and --resume: the source must not call `s`
  PutLines lines(o, in);
  PutLine cur;
  BatchItem item;
  item.task = &cur.task;
  HandedOut handed;
  uint64_t n = 0, skipped = 0;
  bool started = false;
  auto source = [&]() -> const BatchItem * {
    started = true;
    for (;;) {
      if (!lines.next(cur)) {
        if (lines.bad() != 0) throw PutStopped{2};
        return nullptr;
      }
      if ((force || resume) && !peek) peek = resolve_store(sel, kInspect);
      std::optional<TaskRecord> current;
      if (force) current = peek->get(cur.task.id());
      item.options = line_options(o, cur.task, current);
      if (resume && !force && already_stored(*peek, cur, item.options)) {
        ++skipped;
        continue;
      }
      handed.note(n++, cur.line, cur.task.id());
      return &item;
    }
  };
  try {
    const uint64_t saved = s.save_stream(source, true);
    s.close();
    std::cout << "saved " << saved << " Task(s) in one transaction";
    if (resume) std::cout << ", " << skipped << " already stored (skipped)";
    std::cout << "\n";
    return 0;
  } catch (const PutStopped &p) {
    std::cerr << "toolnexus store put: " << lines.bad() << " bad line(s); nothing was saved\n";
    return p.exit_code;
  } catch (const BatchError &e) {
    std::cerr << put_failure(handed.where(e.index()), e) << "\n";
    std::cerr << "toolnexus store put: nothing was saved (one transaction)\n";
    return e.code() == Status::conflict ? 1 : 2;
  } catch (const StoreError &e) {
    if (e.code() != Status::unsupported || started) throw;
  }
  return std::nullopt;
}

// A JSON-lines put into a store without transactions (file:): Task by
// Task, in chunks of kChunk handed to save_stream, which groups the fsyncs.
// A seekable input is checked whole first (a bad line: nothing saved); a
// pipe is checked as it is read (a bad line: the lines before it saved).
// A failure says how far the put got; --resume finishes it.
int put_task_by_task(const Options &o, TaskStore &s, LineReader &in) {
  constexpr size_t kChunk = 1000;
  const bool force = o.flag("--force"), resume = o.flag("--resume");
  if (in.seekable()) {
    PutLines check(o, in);
    PutLine pl;
    while (check.next(pl)) {
    }
    if (check.bad() != 0) {
      std::cerr << "toolnexus store put: " << check.bad() << " bad line(s); nothing was saved\n";
      return 2;
    }
    in.rewind();
  }
  PutLines lines(o, in);
  std::vector<PutLine> chunk;
  std::vector<BatchItem> items;
  std::vector<size_t> item_line;
  uint64_t saved = 0, skipped = 0;
  auto how_far = [&](size_t stop_line) {
    std::cerr << "toolnexus store put: " << saved << " Task(s) saved"
              << (resume ? ", " + std::to_string(skipped) + " already stored" : std::string())
              << ", every line before line " << stop_line
              << "; this store saves Task by Task, not in one transaction: once line " << stop_line
              << " is fixed, run the same put with --resume to finish (Tasks stored as the input has them "
                 "are skipped)\n";
  };
  for (;;) {
    chunk.clear();
    while (chunk.size() < kChunk) {
      chunk.emplace_back();
      if (!lines.next(chunk.back())) {
        chunk.pop_back();
        break;
      }
    }
    if (chunk.empty()) break;
    items.clear();
    item_line.clear();
    for (const PutLine &pl : chunk) {
      std::optional<TaskRecord> current;
      if (force) current = s.get(pl.task.id());
      BatchItem item{&pl.task, line_options(o, pl.task, current)};
      if (resume && !force && already_stored(s, pl, item.options)) {
        ++skipped;
        continue;
      }
      items.push_back(std::move(item));
      item_line.push_back(pl.line);
    }
    size_t k = 0;
    try {
      saved += s.save_stream([&]() -> const BatchItem * { return k < items.size() ? &items[k++] : nullptr; }, false);
    } catch (const BatchError &e) {
      const size_t i = e.index() < items.size() ? e.index() : items.size() - 1;
      saved += i;
      std::cerr << put_failure("line " + std::to_string(item_line[i]) + " (Task '" + printable(items[i].task->id()) + "')", e)
                << "\n";
      how_far(item_line[i]);
      return e.code() == Status::conflict ? 1 : 2;
    }
  }
  if (lines.bad() != 0) {
    std::cerr << "toolnexus store put: " << lines.bad() << " bad line(s)\n";
    how_far(lines.first_bad());
    return 2;
  }
  s.close();
  std::cout << "saved " << saved << " Task(s) Task by Task (the store has no transactions)";
  if (resume) std::cout << ", " << skipped << " already stored (skipped)";
  std::cout << "\n";
  return 0;
}

}  // namespace

// Several Tasks, one per line (JSON lines), streamed: in one transaction
// where the store has them, else Task by Task. Default: new Tasks only;
// --force replaces, keeping owner and tenant not given; --resume skips
// Tasks stored as the input has them (a put that stopped, run again).
int put_lines(const Options &o, LineReader &in) {
  if (o.value("--expect-version"))
    return usage_error("--expect-version applies to one Task; a JSON-lines stream takes --force or nothing");
  auto s = resolve_store(o.positional[1]);
  if (std::optional<int> rc = put_in_one_transaction(o, *s, in)) return *rc;
  return put_task_by_task(o, *s, in);
}

}  // namespace toolnexus::cli::store_detail
