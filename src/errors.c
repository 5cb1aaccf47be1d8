/* errors.c: the message and name of every KVC_E_* code, from KVC_ERRNO_MAP. */
#include "kvcache/errors.h"

#define KVC_EXPORT __attribute__((visibility("default")))

KVC_EXPORT const char *kvc_strerror(int err) {
  switch (err) {
  case 0: return "success";
#define XX(name, code, msg) case code: return msg;
    KVC_ERRNO_MAP(XX)
#undef XX
  default: return "unknown error";
  }
}

KVC_EXPORT const char *kvc_err_name(int err) {
  switch (err) {
  case 0: return "OK";
#define XX(name, code, msg) case code: return #name;
    KVC_ERRNO_MAP(XX)
#undef XX
  default: return "UNKNOWN";
  }
}
