/* tier.h: the engine's side of the disk tier, inside the engine (tier.c;
 * the API is engine_tier.h). */
#ifndef KVC_TIER_H
#define KVC_TIER_H

#include "core.h"

/* A cached page is being reclaimed: hands it to the spill callback, if any
 * and if it can go to the tier (prefix.c calls it before the page is freed). */
void tier_spill(engine_t *eng, const ipage_t *ip);

#endif
