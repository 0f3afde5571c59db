#!/usr/bin/env bash
# The repository stands alone: no file in it may cite the design notes that were kept outside
# it while the project started (a design brief and notes on the driver), since they are
# not shipped. What the code relies on is in docs/driver-behaviour.md (the driver) and
# docs/architecture.md (the design); cite those.
#   no_outside_notes.sh SOURCE_DIR
set -euo pipefail
cd "$1"
# Written so that this file does not match itself.
pattern='design[.]md|driver[-]facts'

# Files whose citations are being removed on a branch not merged yet. Each must still cite the
# notes: once it does not, this test fails until its entry is removed, so the list only shrinks.
pending=()

# Every file of the checkout: tracked and untracked, not ignored (so no build tree).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  hits=$(git grep -lIE --untracked -e "$pattern" -- . || true)
else
  # Not a git checkout (a source archive): skip .git and the folders .gitignore anchors at the top.
  prune=(-path ./.git)
  if [ -f .gitignore ]; then
    while IFS= read -r line; do
      [[ $line == /*/ ]] || continue
      line=${line#/}
      prune+=(-o -path "./${line%/}")
    done <.gitignore
  fi
  hits=$(find . \( "${prune[@]}" \) -prune -o -type f -print0 |
         xargs -0 grep -lIE -e "$pattern" -- | sed 's|^\./||' || true)
fi

status=0
while IFS= read -r file; do
  [ -n "$file" ] || continue
  for p in "${pending[@]}"; do [ "$file" = "$p" ] && continue 2; done
  echo "no_outside_notes: $file cites notes that are not in the repository:" >&2
  grep -nIE -e "$pattern" -- "$file" | sed 's/^/  /' >&2
  status=1
done <<<"$hits"
for p in "${pending[@]}"; do
  if ! grep -qxF -- "$p" <<<"$hits"; then
    echo "no_outside_notes: $p no longer cites the outside notes: remove it from 'pending' in $0" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "no_outside_notes: ok (pending: ${pending[*]})"
exit "$status"
