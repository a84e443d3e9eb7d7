// fuzz/plugin_descriptor_fuzz.cpp: the check of a plugin's descriptor and
// vtable (check_descriptor, core/src/registry.cpp), on descriptors built
// from bytes.
//
// Input: the descriptor's header (struct_size, abi_major), which pointers
// are null, the vtable's header, then NUL-separated strings: name, version,
// and the schemes.
//
// Invariants: the verdict is "" exactly when an independent reading of the
// rules (sdk/include/toolnexus/task_store.h, docs/plugin-guide.md) accepts
// the descriptor; a refusal is a sentence, and one naming a scheme names it
// as given.
#include "fuzz_check.hpp"
#include "plugin_store.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

tnx_status dummy_open(const tnx_open_args *, tnx_store **, char *, uint32_t) { return TNX_EINTERNAL; }

struct Reader {
  const uint8_t *p;
  std::size_t n;
  uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return v;
  }
};

bool scheme_ok(const std::string &s) {
  if (s.empty() || s.size() > 64 || s[0] < 'a' || s[0] > 'z') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.')) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  Reader r{data, size};
  tnx_store_vtable vt;
  std::memset(&vt, 0, sizeof vt);
  tnx_plugin_descriptor d;
  std::memset(&d, 0, sizeof d);
  d.header.struct_size = r.u32() % (2 * sizeof d);
  d.header.abi_major = static_cast<uint16_t>(r.u8() % 3);
  d.header.abi_minor = r.u8();
  const uint8_t present = r.u8();  // which pointers are set
  vt.header.struct_size = r.u32() % (2 * sizeof vt);
  vt.header.abi_major = static_cast<uint16_t>(r.u8() % 3);
  const uint8_t fns = r.u8();  // which of get, save, del, list, close are set
  // Strings: the rest, NUL-separated.
  std::vector<std::string> strs;
  std::string cur;
  while (r.n > 0) {
    const char c = static_cast<char>(r.u8());
    if (c == '\0') {
      strs.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  strs.push_back(cur);
  std::vector<const char *> schemes;
  for (std::size_t i = 2; i < strs.size(); ++i) schemes.push_back(strs[i].c_str());
  schemes.push_back(nullptr);

  if ((present & 1) != 0) d.name = strs[0].c_str();
  if ((present & 2) != 0 && strs.size() > 1) d.version = strs[1].c_str();
  if ((present & 4) != 0) d.schemes = schemes.data();
  if ((present & 8) != 0) d.open = dummy_open;
  if ((present & 16) != 0) d.vtable = &vt;
  // Any non-null function pointer will do: the check never calls them.
  auto fn = [](auto &slot, bool set) {
    using F = std::remove_reference_t<decltype(slot)>;
    slot = set ? reinterpret_cast<F>(&dummy_open) : nullptr;
  };
  fn(vt.get, (fns & 1) != 0);
  fn(vt.save, (fns & 2) != 0);
  fn(vt.del, (fns & 4) != 0);
  fn(vt.list, (fns & 8) != 0);
  fn(vt.close, (fns & 16) != 0);

  const tnx_plugin_descriptor *arg = (present & 32) != 0 ? nullptr : &d;
  const std::string verdict = toolnexus::detail::check_descriptor(arg);

  // The rules, read independently.
  bool sound = arg != nullptr && d.header.abi_major == TNX_ABI_MAJOR &&
               d.header.struct_size >= offsetof(tnx_plugin_descriptor, vtable) + sizeof(void *) &&
               d.name != nullptr && d.name[0] != '\0' && d.version != nullptr && d.schemes != nullptr &&
               d.schemes[0] != nullptr && d.open != nullptr && d.vtable != nullptr &&
               vt.header.abi_major == TNX_ABI_MAJOR &&
               vt.header.struct_size >= offsetof(tnx_store_vtable, close) + sizeof(void *) && (fns & 31) == 31;
  std::string bad_scheme;  // the first invalid scheme listed
  bool has_bad_scheme = false;
  if (d.schemes != nullptr)
    for (const char *const *s = d.schemes; *s != nullptr && !has_bad_scheme; ++s)
      if (!scheme_ok(*s)) {
        has_bad_scheme = true;
        bad_scheme = *s;
      }
  sound = sound && !has_bad_scheme;
  FUZZ_CHECK(verdict.empty() == sound, verdict.empty() ? std::string("an unsound descriptor accepted") : verdict);
  if (!verdict.empty() && verdict.find("invalid scheme") != std::string::npos)
    FUZZ_CHECK(has_bad_scheme && verdict.find("'" + bad_scheme + "'") != std::string::npos, verdict + " / " + bad_scheme);
  return 0;
}
