/* pageio.h: indexed pages out of the index and back in, for the tiers
 * behind the pool (pageio.c; the API is engine.h's "tiers" part). */
#ifndef KVC_PAGEIO_H
#define KVC_PAGEIO_H

#include "core.h"

/* prefix.c, before it reclaims the cached page ip: hands it to the tier's
 * reclaimed hook (set, or this is not called). */
void pageio_reclaimed(engine_t *eng, const ipage_t *ip);

#endif
