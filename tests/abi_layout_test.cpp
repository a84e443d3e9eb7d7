// ABI layout: the struct layouts of ABI 1.x are frozen (append-only), the
// same in C and C++, and the status helpers behave as documented.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "toolnexus/task_store.h"

#include <cstring>
#include <string>

extern "C" void tnx_test_c_layout(size_t out[9]);

// x86_64 / LP64 layout of ABI 1.0, frozen. A failure here means a change
// broke every plugin ever built.
static_assert(sizeof(void *) != 8 || sizeof(tnx_str) == 16);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, id) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, context_id) == 24);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, state) == 40);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, status_time_us) == 56);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, owner) == 64);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, tenant) == 80);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, task_json) == 96);
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, version) == 112);
// ABI 1.2 appended problem; 1.0/1.1's record ended at 120.
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, problem) == 120);
// ABI 1.5 appended due_us; 1.2..1.4's record ended at 136.
static_assert(sizeof(void *) != 8 || offsetof(tnx_task_record, due_us) == 136);
static_assert(sizeof(void *) != 8 || sizeof(tnx_task_record) == 144);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, filter_flags) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, page_size) == 12);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, context_id) == 16);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, after_us) == 80);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, cursor) == 96);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, omit_json) == 112);
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, deliver_corrupt) == 116);
// ABI 1.5 appended due_before_us; 1.1..1.4's query ended at 120.
static_assert(sizeof(void *) != 8 || offsetof(tnx_list_query, due_before_us) == 120);
static_assert(sizeof(void *) != 8 || sizeof(tnx_list_query) == 128);
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, get) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, close) == 40);
// ABI 1.3 appended count and save_batch; 1.0..1.2's vtable ended at 48.
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, count) == 48);
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, save_batch) == 56);
// ABI 1.4 appended watch and unwatch; 1.3's vtable ended at 64.
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, watch) == 64);
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, unwatch) == 72);
// ABI 1.5 appended save_stream; 1.4's vtable ended at 80.
static_assert(sizeof(void *) != 8 || offsetof(tnx_store_vtable, save_stream) == 80);
static_assert(sizeof(void *) != 8 || sizeof(tnx_store_vtable) == 88);
// ABI 1.4's tnx_change.
static_assert(sizeof(void *) != 8 || offsetof(tnx_change, kind) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_change, id) == 16);
static_assert(sizeof(void *) != 8 || offsetof(tnx_change, version) == 32);
static_assert(sizeof(void *) != 8 || sizeof(tnx_change) == 40);
static_assert(sizeof(void *) != 8 || sizeof(tnx_host_info) == 24);
// ABI 1.2 appended flags, reserved0 and capabilities; 1.1's ended at 56.
static_assert(sizeof(void *) != 8 || offsetof(tnx_open_args, flags) == 56);
static_assert(sizeof(void *) != 8 || offsetof(tnx_open_args, capabilities) == 64);
// ABI 1.6 appended services; 1.2..1.5's open args ended at 72.
static_assert(sizeof(void *) != 8 || offsetof(tnx_open_args, services) == 72);
static_assert(sizeof(void *) != 8 || sizeof(tnx_open_args) == 80);
// ABI 1.6's tnx_host_services.
static_assert(sizeof(void *) != 8 || offsetof(tnx_host_services, host_ctx) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_host_services, open_inner) == 16);
static_assert(sizeof(void *) != 8 || sizeof(tnx_host_services) == 24);
static_assert(sizeof(void *) != 8 || offsetof(tnx_plugin_descriptor, name) == 8);
static_assert(sizeof(void *) != 8 || offsetof(tnx_plugin_descriptor, capabilities) == 40);
static_assert(sizeof(void *) != 8 || offsetof(tnx_plugin_descriptor, vtable) == 56);
// ABI 1.1 appended location_syntax; 1.0's descriptor ended at 64 bytes.
static_assert(sizeof(void *) != 8 || offsetof(tnx_plugin_descriptor, location_syntax) == 64);
static_assert(sizeof(void *) != 8 || sizeof(tnx_plugin_descriptor) == 72);

TEST_CASE("C and C++ agree on every struct's size") {
  size_t c[9];
  tnx_test_c_layout(c);
  CHECK(c[0] == sizeof(tnx_str));
  CHECK(c[1] == sizeof(tnx_task_record));
  CHECK(c[2] == sizeof(tnx_list_query));
  CHECK(c[3] == sizeof(tnx_store_vtable));
  CHECK(c[4] == sizeof(tnx_host_info));
  CHECK(c[5] == sizeof(tnx_open_args));
  CHECK(c[6] == sizeof(tnx_plugin_descriptor));
  CHECK(c[7] == sizeof(tnx_change));
  CHECK(c[8] == sizeof(tnx_host_services));
}

TEST_CASE("status names and messages cover the closed set") {
  const tnx_status all[] = {TNX_OK, TNX_ENOTFOUND, TNX_ECONFLICT, TNX_EINVAL,
                            TNX_EIO, TNX_ECORRUPT, TNX_EUNSUPPORTED, TNX_EINTERNAL};
  const char *names[] = {"TNX_OK", "TNX_ENOTFOUND", "TNX_ECONFLICT", "TNX_EINVAL",
                         "TNX_EIO", "TNX_ECORRUPT", "TNX_EUNSUPPORTED", "TNX_EINTERNAL"};
  for (size_t i = 0; i < 8; ++i) {
    CHECK(std::string(tnx_err_name(all[i])) == names[i]);
    CHECK(all[i] == -static_cast<tnx_status>(i));
    CHECK(std::string(tnx_strerror(all[i])) != "unknown status");
  }
  CHECK(std::string(tnx_err_name(-99)) == "TNX_E?");
  CHECK(std::string(tnx_strerror(42)) == "unknown status");
  CHECK(std::string(tnx_strerror(TNX_ECONFLICT)) == "version conflict");
}

TEST_CASE("tnx_set_error truncates and always terminates") {
  char buf[8];
  std::memset(buf, 'X', sizeof buf);
  tnx_set_error(buf, sizeof buf, "0123456789");
  CHECK(std::string(buf) == "0123456");
  tnx_set_error(buf, sizeof buf, "ab");
  CHECK(std::string(buf) == "ab");
  tnx_set_error(nullptr, 0, "ignored");  // must not crash
  char one[1] = {'Z'};
  tnx_set_error(one, 1, "x");
  CHECK(one[0] == '\0');
}

TEST_CASE("a 1.5 host's open args carry no services (a decorator must not read past them)") {
  tnx_open_args a{};
  a.header = tnx_header(offsetof(tnx_open_args, services));  // as a 1.2..1.5 host wrote it
  CHECK(TNX_HAS_FIELD(&a, tnx_open_args, capabilities));
  CHECK_FALSE(TNX_HAS_FIELD(&a, tnx_open_args, services));
  a.header = tnx_header(sizeof a);
  CHECK(TNX_HAS_FIELD(&a, tnx_open_args, services));
}

TEST_CASE("TNX_HAS_FIELD never reaches past a smaller struct") {
  tnx_plugin_descriptor d{};
  d.header = tnx_header(offsetof(tnx_plugin_descriptor, location_syntax));  // as 1.0 wrote it
  CHECK(TNX_HAS_FIELD(&d, tnx_plugin_descriptor, vtable));
  CHECK_FALSE(TNX_HAS_FIELD(&d, tnx_plugin_descriptor, location_syntax));
  d.header = tnx_header(sizeof d);
  CHECK(TNX_HAS_FIELD(&d, tnx_plugin_descriptor, location_syntax));
  CHECK(d.header.abi_major == TNX_ABI_MAJOR);
  CHECK(d.header.abi_minor == TNX_ABI_MINOR);
}
