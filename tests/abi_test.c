/* The SDK header compiled as C11 (-Wpedantic, warnings as errors): a plugin
 * author needs no C++. Also reports the C layout so the C++ test can check
 * that both languages agree on every struct. */
#include "toolnexus/task_store.h"

_Static_assert(sizeof(tnx_abi_header) == 8, "header is 8 bytes");
_Static_assert(offsetof(tnx_task_record, id) == 8, "fields follow the header");
_Static_assert(TNX_OK == 0 && TNX_EINTERNAL == -7, "status codes are fixed");

/* Sizes of every ABI struct as a C compiler lays them out. */
void tnx_test_c_layout(size_t out[9]) {
  out[0] = sizeof(tnx_str);
  out[1] = sizeof(tnx_task_record);
  out[2] = sizeof(tnx_list_query);
  out[3] = sizeof(tnx_store_vtable);
  out[4] = sizeof(tnx_host_info);
  out[5] = sizeof(tnx_open_args);
  out[6] = sizeof(tnx_plugin_descriptor);
  out[7] = sizeof(tnx_change);
  out[8] = sizeof(tnx_host_services);
}
