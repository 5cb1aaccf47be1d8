/* exports.c: libkvcache exports only kvc_* symbols, and every KVC_E_* code
 * round-trips through the wire Status enum of the same name. */
#include "harness.h"
#include "kvcache.pb-c.h"

TEST(exports_only_kvc_symbols) {
  char cmd[512], line[512];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s/libkvcache.so'", it_build());
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  int total = 0;
  bool open_seen = false, put_shm_seen = false, strerror_seen = false;
  while (fgets(line, sizeof line, p)) {
    char addr[64], type[8], name[256];
    if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3) continue;
    if (strncmp(name, "kvc_", 4) != 0) TEST_FAIL_("exported symbol %s is not kvc_*", name);
    open_seen |= strcmp(name, "kvc_client_open") == 0;
    put_shm_seen |= strcmp(name, "kvc_put_shm") == 0;
    strerror_seen |= strcmp(name, "kvc_strerror") == 0;
    total++;
  }
  ASSERT_EQ(pclose(p), 0);
  ASSERT(open_seen && put_shm_seen && strerror_seen);
  ASSERT(total >= 38);
}

TEST(status_codes_round_trip) {
  const ProtobufCEnumDescriptor *d = &kvcache__v1__status__descriptor;
  int codes = 0;
#define XX(NAME_, CODE_, MSG_)                                                 \
  do {                                                                         \
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, -(CODE_)); \
    ASSERT(v != NULL);                                                         \
    ASSERT_STR_EQ(v->name, #NAME_);                                            \
    ASSERT_STR_EQ(kvc_err_name(-v->value), #NAME_);                            \
    codes++;                                                                   \
  } while (0);
  KVC_ERRNO_MAP(XX)
#undef XX
  /* And back: every status but OK is a code. */
  ASSERT_EQ(d->n_values, (unsigned)codes + 1);
  for (unsigned i = 0; i < d->n_values; i++) {
    int v = d->values[i].value;
    if (v == 0) continue;
    ASSERT_STR_EQ(kvc_err_name(-v), d->values[i].name);
    ASSERT(strcmp(kvc_strerror(-v), "unknown error") != 0);
  }
  ASSERT_EQ(codes, -(KVC_E_MIN_ + 1));
}
