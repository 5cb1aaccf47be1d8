/* wirestatus.c: an engine or daemon code (0, KVC_E_*) as the wire's Status,
 * for every reply the daemon sends (dispatch.c, poolresize.c): a leaf. */
#include "dispatch.h"

Kvcache__V1__Status dispatch_status(int code) {
  if (code == 0) return KVCACHE__V1__STATUS__OK;
  if (code < 0 && code > KVC_E_MIN_) return (Kvcache__V1__Status)(-code);
  return KVCACHE__V1__STATUS__INTERNAL;
}
