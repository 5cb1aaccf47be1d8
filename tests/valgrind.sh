#!/bin/sh
# valgrind.sh: stands in for kvcached in `make valgrind`: runs the real
# daemon (kvcached.real beside it) under memcheck. Errors exit 99 and are
# reported on stderr (the daemon's log), where daemon_stop finds them.
here=$(dirname "$0")
exec valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --show-leak-kinds=definite "$here/kvcached.real" "$@"
