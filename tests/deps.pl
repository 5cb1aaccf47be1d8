#!/usr/bin/perl
# deps.pl: checks that every external command the suite runs comes from a
# package `make deps` installs (the Makefile's DEB_PACKAGES, and what those
# depend on) or from Debian's minimal base (Essential or required packages),
# so `make test` on a fresh minbase system needs nothing but `make deps`.
#
# It bootstraps nothing. It reads the commands from the sources: in the C
# tests, the shell lines given to it_sh, system, popen, execlp and the
# commands built with snprintf (every word in command position: first, after
# |, &&, ||, ;, $( and env); in the test scripts, every line; in the Makefile,
# every recipe of the targets make test and make run use; in the units, their
# Exec lines; in README.md and doc/worker-guide.md, the command blocks
# tests/readme.sh runs. Each command must be installed, and dpkg must name a package of
# that set as its owner. Prints "PASS name" or "FAIL name why" (the test
# protocol of tests/run.sh); perl itself is perl-base, which is Essential.
#
#   tests/deps.pl --list          the one test's name
#   tests/deps.pl [NAME]          run it (from the source tree)
use strict;
use warnings;

my $NAME = 'deps_cover_every_command';
if (@ARGV && $ARGV[0] eq '--list') { print "$NAME\n"; exit 0; }
if (@ARGV && !grep { $_ eq $NAME } @ARGV) { print STDERR "no test named $ARGV[0]\n"; exit 1; }
my $src = $ENV{KVC_SRCDIR} || '.';

# Shell builtins and keywords (dash): no package runs them.
my %builtin = map { $_ => 1 } qw(
  . : [ alias break cd command continue echo eval exec exit export false getopts
  hash kill local printf pwd read readonly return set shift test times trap true
  type ulimit umask unalias unset wait if then else elif fi for do done while until
  case esac in ! { } time);
# Our own programs (run from the build or the install tree).
my %ours = map { $_ => 1 } qw(kvcached kvcachectl);

my %cmd;                  # command -> "file:line" of its first use
my %shfunc;               # functions the test scripts define
sub found {
  my ($word, $where, $strict) = @_;
  return if !defined $word || $word eq '' || $builtin{$word} || $ours{$word};
  return if $word !~ m{^[A-Za-z/][A-Za-z0-9_./+-]*$} || $word =~ m{%} || $shfunc{$word};
  return if $word =~ m{^[^/].*/};                   # a program of the tree (build/..., tests/...)
  return if !$strict && !which($word);
  $cmd{$word} //= $where;
}

# The command words of one shell line: the first word of each command.
sub shell_words {
  my ($line, $where, $strict_first) = @_;
  $line =~ s{\\n}{\n}g;
  $line =~ s{\\"}{"}g;
  $line =~ s{'[^']*'}{''}g;                 # quoted text is data (patterns, messages)
  $line =~ s{"[^"]*"}{ my $q = $&; $q =~ /\$\(/ ? $q : '""' }ge;
  1 while $line =~ s{\$\(\([^()]*\)\)}{0}g; # arithmetic
  my %optional = map { $_ => 1 } $line =~ /\bcommand -v (\S+)/g;  # run only if there
  my @seg = split m{\|\||&&|[|;\n`]|\$\(|\bthen\b|\bdo\b|\belse\b|\{|\}|\(|\)}, $line;
  for my $i (0 .. $#seg) {
    my @w = split ' ', $seg[$i];
    shift @w while @w && ($w[0] =~ m{^[A-Za-z_][A-Za-z0-9_]*=} || $w[0] eq '!');
    next unless @w;
    if ($w[0] eq 'env') {             # env [-u NAME]... [NAME=value]... command
      shift @w;
      while (@w && ($w[0] =~ m{^-} || $w[0] =~ m{=})) { my $o = shift @w; shift @w if $o eq '-u'; }
      found('env', $where, 1);
    }
    if (@w && $w[0] eq 'command' && @w > 2 && $w[1] eq '-v') { next; }
    found($w[0], $where, $i > 0 || $strict_first) if @w && !$optional{$w[0]};
  }
}

sub which {
  my ($c) = @_;
  for my $d (split /:/, $ENV{PATH} || '/usr/bin:/bin') { return "$d/$c" if -x "$d/$c" && !-d "$d/$c"; }
  return undef;
}

sub slurp { my ($f) = @_; open my $h, '<', $f or die "$f: $!"; local $/; my $t = <$h>; close $h; $t }

# ---- the C tests: string literals and the call they are an argument of ----
my %shell_call = (it_sh => 2, system => 0, popen => 0, execlp => 0, execvp => 0, ctl_run => 4);
for my $f (glob("$src/tests/unit/*.c $src/tests/integration/*.c $src/tests/integration/*.h $src/tests/*.c $src/tests/fuzz/*.c")) {
  my $t = slurp($f);
  (my $rel = $f) =~ s{^\Q$src\E/}{};
  my @stack;
  my ($ident, $line) = ('', 1);
  my @lits;   # [text, call, argument index, line]
  my $i = 0;
  my $n = length $t;
  my $pending;  # a literal being concatenated
  while ($i < $n) {
    my $c = substr($t, $i, 1);
    if ($c eq "\n") { $line++; $i++; next; }
    if (substr($t, $i, 2) eq '//') { $i = index($t, "\n", $i); $i = $n if $i < 0; next; }
    if (substr($t, $i, 2) eq '/*') {
      my $e = index($t, '*/', $i + 2); $e = $n if $e < 0;
      $line += () = substr($t, $i, $e - $i) =~ /\n/g; $i = $e + 2; next;
    }
    if ($c eq "'") { $i++; $i += (substr($t, $i, 1) eq '\\') ? 2 : 1 while substr($t, $i, 1) ne "'"; $i++; next; }
    if ($c eq '"') {
      my $j = $i + 1;
      $j += (substr($t, $j, 1) eq '\\') ? 2 : 1 while $j < $n && substr($t, $j, 1) ne '"';
      my $s = substr($t, $i + 1, $j - $i - 1);
      if ($pending) { $pending->[0] .= $s; }
      else {
        my $top = $stack[-1];
        $pending = [$s, $top ? $top->[0] : '', $top ? $top->[1] : -1, $line];
        push @lits, $pending;
      }
      $i = $j + 1; next;
    }
    if ($c =~ /\s/) { $i++; next; }
    $pending = undef;
    if ($c =~ /[A-Za-z_]/) { my ($w) = substr($t, $i) =~ /^(\w+)/; $ident = $w; $i += length $w; next; }
    if ($c eq '(') { push @stack, [$ident, 0]; }
    elsif ($c eq ')') { pop @stack; }
    elsif ($c eq ',' && @stack) { $stack[-1][1]++; }
    $ident = '';
    $i++;
  }
  for my $l (@lits) {
    my ($s, $call, $arg, $ln) = @$l;
    my $where = "$rel:$ln";
    if (exists $shell_call{$call} && $arg == $shell_call{$call}) {
      # ctl_run's format is kvcachectl's arguments: only what follows a pipe.
      $s = "kvcachectl $s" if $call eq 'ctl_run';
      shell_words($s, $where, 1);
    } elsif ($call eq 'snprintf' && $arg == 2) {
      shell_words($s, $where, 0);   # maybe a command; counted if installed
    }
  }
}

# ---- the test scripts ----
for my $f (glob("$src/tests/*.sh $src/tests/fuzz/*.sh")) {
  (my $rel = $f) =~ s{^\Q$src\E/}{};
  my $ln = 0;
  for (split /\n/, slurp($f)) {
    $ln++;
    next if /^\s*#/;
    s/\s#.*$//;
    $shfunc{$1} = 1 if /^\s*([A-Za-z_]\w*)\s*\(\)/;
    s/^\s*[^()\s'"]*\)\s*//;       # a case pattern
    shell_words($_, "$rel:$ln", 1);
  }
}

# ---- the command blocks of the README and the worker's guide, which
# tests/readme.sh runs (```sh blocks not marked <!-- readme-test: skip -->) ----
for my $doc ('README.md', 'doc/worker-guide.md') {
  my ($ln, $fence, $run, $mark) = (0, 0, 0, 'run');
  for (split /\n/, slurp("$src/$doc")) {
    $ln++;
    if (/^```(\w*)/) {
      if ($fence) { ($fence, $run) = (0, 0); next; }
      ($fence, $run, $mark) = (1, $1 eq 'sh' && $mark !~ /^skip\b/, 'run');
      next;
    }
    if ($fence) { shell_words(s/\s#.*$//r, "$doc:$ln", 1) if $run; next; }
    if (/^<!-- readme-test: (\S+)/) { $mark = $1; next; }
    $mark = 'run' if /\S/;
  }
}

# ---- the Makefile: the recipes make test, make run and make deps run ----
{
  my $mk = slurp("$src/Makefile");
  $mk =~ s/\\\n/ /g;
  my %skip = map { $_ => 1 } qw(bench fuzz fuzz-build fuzz-corpus valgrind tsan soak clean uninstall
    systemd/kvcached.conf $(B)/fuzz/% $(B)/tools/gen_corpus $(B)/bench/%);
  my %var;   # a recipe line that is one variable runs that variable's lines
  $var{$1} = $2 while $mk =~ /^([A-Z_]+)\s*[:?]?=\s*(.*)$/mg;
  my ($target, $ln) = ('', 0);
  for (split /\n/, $mk) {
    $ln++;
    s/^(\t[@-]*)\$\(([A-Z_]+)\)/$1 . ($var{$2} \/\/ "\$($2)")/e;
    s/\|\| \$\(([A-Z_]+)\)/'|| ' . ($var{$1} \/\/ 'X')/e;
    if (/^([^\s:#=][^:=]*?)\s*:(?!=)/) { $target = $1; next; }
    next unless /^\t/ && !$skip{$target};
    s/^\t[@-]*//;
    s/\$\(Q\)//g;
    s/\$\(call say,[^)]*\)//g;
    s/\$\((CC|INSTALL)\)/lc $1/ge;
    s/\$\(MAKE\)/make/g;
    1 while s/(?<!\$)\$\([^()]*\)/X/g;  # make's variables and functions are arguments
    s/\$\$/\$/g;                     # $$(cmd) is the shell's $(cmd)
    shell_words($_, "Makefile:$ln ($target)", 1);
  }
}

# ---- the units: the commands systemd-analyze verify looks for ----
for my $f (glob("$src/systemd/*.service")) {
  (my $rel = $f) =~ s{^\Q$src\E/}{};
  my $ln = 0;
  for (split /\n/, slurp($f)) {
    $ln++;
    next unless /^Exec\w*=[-@:+!]*(\S+)/;
    my $path = $1;
    next if $path =~ m{/kvcached$};
    found($path, "$rel:$ln", 1);   # the path itself must exist
  }
}

# ---- the packages: DEB_PACKAGES, the minimal base, and their dependencies ----
my $mk = slurp("$src/Makefile");
$mk =~ s/\\\n/ /g;
my ($list) = $mk =~ /^DEB_PACKAGES\s*:?=\s*(.*)$/m or die "no DEB_PACKAGES in the Makefile\n";
my @deb = split ' ', $list;
my (%dep, %provider, %base, %installed);
open my $q, '-|', 'dpkg-query', '-W', '-f', '${Package}\t${Essential}\t${Priority}\t${Pre-Depends}, ${Depends}\t${Provides}\t${db:Status-Status}\n'
  or die "dpkg-query: $!";
while (<$q>) {
  chomp;
  my ($p, $ess, $prio, $deps, $prov, $status) = split /\t/, $_, -1;
  next if !$status || $status eq 'not-installed' || $status eq 'config-files';
  $installed{$p} = 1;
  $base{$p} = 1 if $ess eq 'yes' || $prio eq 'required';
  $dep{$p} = [map { [map { (split /[\s:(]/, s/^\s+//r)[0] } split /\|/] } grep { /\S/ } split /,/, $deps];
  for (split /,/, $prov) { my ($v) = /^\s*([^\s(]+)/ or next; push @{$provider{$v}}, $p; }
}
close $q;
my %allowed;
my @todo = (@deb, keys %base);
while (defined(my $p = shift @todo)) {
  my @real = $installed{$p} ? ($p) : @{$provider{$p} || []};
  for my $r (@real) {
    next if $allowed{$r}++;
    for my $alts (@{$dep{$r} || []}) { push @todo, grep { $installed{$_} || $provider{$_} } @$alts; }
  }
}

# The packages that own path, or a link on its way (alternatives, the
# merged /usr: /bin/kill is /usr/bin/kill).
sub owners {
  my ($path) = @_;
  my %own;
  for (my $hops = 0; defined $path && $hops < 10; $hops++) {
    for my $p ($path, $path =~ s{^/usr/}{/}r, $path =~ s{^/(bin|sbin|lib)/}{/usr/$1/}r) {
      for (split /\n/, `dpkg-query -S '$p' 2>/dev/null`) {
        next if /^diversion/ || !/^(.*?): \//;
        $own{s/:[\w-]+$//r} = 1 for split /, /, $1;
      }
    }
    my $next = readlink $path;
    last unless defined $next;
    $next = ($path =~ s{[^/]*$}{}r) . $next unless $next =~ m{^/};
    $path = $next;
  }
  return sort keys %own;
}

my @fail;
for my $c (sort keys %cmd) {
  my $path = $c =~ m{^/} ? (-x $c ? $c : undef) : which($c);
  if (!$path) {
    push @fail, "$c (run by $cmd{$c}) is not installed: make deps must install its package";
    next;
  }
  my @own = owners($path);
  if (!@own) { push @fail, "$c ($path, run by $cmd{$c}): dpkg knows no package that owns it"; next; }
  next if grep { $allowed{$_} } @own;
  push @fail, "$c (run by $cmd{$c}) comes from " . join(' or ', @own) .
              ", which make deps does not install (DEB_PACKAGES: @deb)";
}
if (@fail) {
  print STDERR "$_\n" for @fail;
  print "FAIL $NAME " . scalar(@fail) . " of " . scalar(keys %cmd) . " commands not covered\n";
  exit 1;
}
print STDERR scalar(keys %cmd) . " commands, each from a package of make deps or the base: " .
             join(' ', sort grep { !m{^/} } keys %cmd) . "\n";
print "PASS $NAME\n";
