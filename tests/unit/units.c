/* units.c: byte counts in messages (src/units.c): exact in the unit an
 * option takes back when one divides them, one decimal otherwise. */
#include "test.h"
#include "units.h"

TEST(units_bytes_reads_as_options_do) {
  static const struct { uint64_t v; const char *text; } cases[] = {
      {0, "0 bytes"},
      {100, "100 bytes"},
      {1023, "1023 bytes"},
      {1024, "1KiB"},
      {1536, "1.5KiB"},
      {16384, "16KiB"},
      {1ull << 20, "1MiB"},
      {1536ull << 20, "1536MiB"},        /* exact, as kvcached --print-config */
      {64ull << 40, "64TiB"},
      {68719476736ull, "64GiB"},        /* the MemAvailable message's */
      {25276973056ull, "23.5GiB"},      /* no unit divides it in few digits */
      {33554432ull * 3 + 4096, "96.0MiB"},
      {UINT64_MAX, "16.0EiB"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[UNITS_LEN];
    ASSERT_STR_EQ(units_bytes(cases[i].v, buf, sizeof buf), cases[i].text);
  }
}
