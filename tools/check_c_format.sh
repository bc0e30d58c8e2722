#!/usr/bin/env bash
# Reports the C files that clang-format, with the repository's .clang-format,
# would change: the C counterpart of `ruff check` (docs/architecture.md rule 12).
# It changes no file.  Exit 0: every file is formatted; 1: some are not (listed,
# with the changed line count; -d also prints the diffs); 2: no clang-format.
#
#   tools/check_c_format.sh [-d] [FILE ...]     (default: every tracked C file)
#
# The style was written for clang-format 14 (Debian 12: apt-get install
# clang-format, version 1:14.0-55.7~deb12u1).  Other versions format some
# constructs differently, so with another version the result is only advisory,
# and the script says so.  CLANG_FORMAT=/path/to/clang-format picks the binary.
# tools/test.sh runs it after ruff.
set -euo pipefail
cd "$(dirname "$0")/.."

want_major=14
cf="${CLANG_FORMAT:-}"
if [ -z "$cf" ]; then
  for c in clang-format-$want_major clang-format; do
    if command -v "$c" >/dev/null 2>&1; then cf=$c; break; fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null 2>&1; then
  echo "tools/check_c_format.sh: clang-format not found (Debian: apt-get install clang-format)" >&2
  exit 2
fi
version=$("$cf" --version)
major=$(sed -n 's/.*version \([0-9]*\)\..*/\1/p' <<<"$version")
if [ "$major" != "$want_major" ]; then
  echo "tools/check_c_format.sh: $version is not clang-format $want_major; differences may be the version's" >&2
fi

show_diff=0
if [ "${1:-}" = "-d" ]; then show_diff=1; shift; fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- 'csrc/*.c' 'csrc/*.h' 'tests/c/*.c' 'tests/c/*.h' \
                                       'tests/fuzz/*.c' 'tests/fuzz/*.h')
fi

bad=0
for f in "${files[@]}"; do
  if ! out=$(diff -u --label "$f" --label "$f (clang-format)" "$f" <("$cf" --style=file "$f")); then
    bad=$((bad + 1))
    echo "$f: $(( $(grep -c '^-' <<<"$out") - 1 )) lines differ"  # less the --- header
    if [ "$show_diff" = 1 ]; then printf '%s\n' "$out"; fi
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "tools/check_c_format.sh: $bad of ${#files[@]} files differ from .clang-format ($version)" >&2
  exit 1
fi
echo "tools/check_c_format.sh: ${#files[@]} files formatted"
