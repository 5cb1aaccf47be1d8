# readme.awk: the command blocks of a Markdown file, for tests/readme.sh.
# Writes each ```sh and ```python block to DIR/NNN (numbered from START + 1)
# and prints one line per block: NNN LANG DOC:LINE MARK [REASON], MARK being
# what the HTML comment <!-- readme-test: MARK [REASON] --> right before it
# says (blank lines between allowed), or "run". Other fences (```c, a
# listing) hold no commands: skipped, to their closing fence.
BEGIN { n = start; mark = "run" }
/^```/ {
  if (inblock) { inblock = 0; close(file); next }
  if (other) { other = 0; next }
  lang = substr($0, 4)
  sub(/[ \t].*$/, "", lang)
  if (lang != "sh" && lang != "python") { other = 1; mark = "run"; next }
  n++
  file = sprintf("%s/%03d", dir, n)
  printf "" > file
  inblock = 1
  printf "%03d %s %s:%d %s\n", n, lang, doc, NR, mark
  mark = "run"
  next
}
inblock { print > file; next }
other { next }
/^<!-- readme-test: / {
  mark = $0
  sub(/^<!-- readme-test: /, "", mark)
  sub(/ *-->.*$/, "", mark)
  next
}
/^[ \t]*$/ { next }
{ mark = "run" }
END { if (inblock || other) { print "unclosed fence in " doc > "/dev/stderr"; exit 1 } }
