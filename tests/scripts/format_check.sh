#!/usr/bin/env bash
# The C++ files follow the repository's .clang-format (Google style, 100 columns), as
# clang-format 14 (Debian 12's) formats them: other major versions format the same
# configuration differently, so the check runs with 14 only, unless told otherwise.
# Lists every file that clang-format would change, with the command that fixes them;
# changes nothing itself. .ci/run runs it.
# Usage: format_check.sh [--diff] [FILE...]
#   FILE...   the files to check (default: every *.cc, *.h, *.cpp, *.hpp, *.c file git tracks)
#   --diff    also print what clang-format would change
#   CLANG_FORMAT=path  use that clang-format, whatever its version (a note says which)
# Exit: 0 formatted (or skipped: no clang-format 14, with a SKIP line), 1 some file is not,
# 2 bad usage or a file that cannot be read.
set -euo pipefail
cd "$(dirname "$0")/../.."
pinned=14

show_diff=0
files=()
for arg in "$@"; do
  case $arg in
    --diff) show_diff=1 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format_check: unknown option $arg" >&2; exit 2 ;;
    *) files+=("$arg") ;;
  esac
done

major_of() { "$1" --version 2>/dev/null | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p'; }

if [ -n "${CLANG_FORMAT:-}" ]; then
  tool=$CLANG_FORMAT
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "format_check: CLANG_FORMAT=$tool is not a program" >&2
    exit 2
  fi
  major=$(major_of "$tool")
  [ "$major" = "$pinned" ] ||
    echo "format_check: note: $tool is clang-format ${major:-of unknown version}, not $pinned;" \
      "its output may differ from what the tree was formatted with"
else
  tool=
  for candidate in clang-format-$pinned clang-format; do
    if command -v "$candidate" >/dev/null 2>&1 && [ "$(major_of "$candidate")" = "$pinned" ]; then
      tool=$candidate
      break
    fi
  done
  if [ -z "$tool" ]; then
    found=$(command -v clang-format 2>/dev/null || true)
    echo "format_check: SKIP: no clang-format $pinned on PATH" \
      "(${found:+found $found, version $(major_of "$found"); }apt-get install clang-format-$pinned," \
      "or set CLANG_FORMAT to use another version)"
    exit 0
  fi
fi

if [ ${#files[@]} -eq 0 ]; then
  if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "format_check: not a git checkout: name the files to check" >&2
    exit 2
  fi
  mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cpp' '*.hpp' '*.c')
fi

unformatted=()
for file in "${files[@]}"; do
  if [ ! -r "$file" ]; then
    echo "format_check: cannot read $file" >&2
    exit 2
  fi
  # --style=file: the .clang-format above the file; -Werror: a change needed is an error.
  if ! "$tool" --dry-run -Werror --style=file "$file" >/dev/null 2>&1; then
    unformatted+=("$file")
    if [ $show_diff = 1 ]; then
      "$tool" --style=file "$file" | diff -u --label "$file" --label "$file (clang-format)" \
        "$file" - || true
    fi
  fi
done

if [ ${#unformatted[@]} -gt 0 ]; then
  echo "format_check: ${#unformatted[@]} of ${#files[@]} files are not formatted ($tool):"
  printf '  %s\n' "${unformatted[@]}"
  echo "fix: $tool -i --style=file ${unformatted[*]}"
  exit 1
fi
echo "format_check: all ${#files[@]} files formatted ($tool, version $(major_of "$tool"))"
