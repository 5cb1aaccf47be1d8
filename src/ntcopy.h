/* ntcopy.h: copying into memory that no CPU will read soon (a put's bytes
 * into pool pages), with non-temporal stores.
 *
 * A plain store to a line not in the cache first reads the line (read for
 * ownership), so copying into cold pool pages moves every byte twice over
 * the memory bus; a streaming store writes the line whole and skips the
 * read. Measured here (16 KiB runs into a cold 1 GiB region, the shape of a
 * 1 MiB put into 2 MiB pages): memcpy 11-12 GB/s, streaming stores 18-24
 * GB/s. glibc's memcpy streams only copies larger than a cache-sized
 * threshold, and a put is many runs of a few KiB.
 */
#ifndef KVC_NTCOPY_H
#define KVC_NTCOPY_H

#include <stddef.h>

/* memcpy(dst, src, n), past the caches where the CPU can (x86-64) and n is
 * large enough to gain. Streaming stores are weakly ordered: call
 * ntcopy_fence before the bytes are handed to another thread or process. */
void ntcopy(void *dst, const void *src, size_t n);

/* Orders every ntcopy before the stores that follow (sfence). */
void ntcopy_fence(void);

#endif
