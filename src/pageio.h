/* pageio.h: indexed pages out of the index and back in, for the tiers
 * behind the pool (pageio.c; the API is engine.h's "tiers" part). */
#ifndef KVC_PAGEIO_H
#define KVC_PAGEIO_H

#include "core.h"

/* prefix.c, before it reclaims the cached page ip: hands it to the tier's
 * reclaimed hook (set, or this is not called). */
void pageio_reclaimed(engine_t *eng, const ipage_t *ip);

/* tier.c: the page of a job of engine_tier_import_begin, and its cache. */
uint32_t tier_job_page(const struct engine_tier_job *job, uint32_t *cache_id);
/* tier.c: the job's page was just indexed (prefix_insert): the index's
 * reference is added, the job's hold dropped (the page becomes cached, the
 * most recent), the job freed. */
void tier_job_indexed(engine_t *eng, struct engine_tier_job *job);

#endif
