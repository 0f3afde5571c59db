#!/usr/bin/env bash
# The layers of docs/architecture.md include only downward along its arrows:
# entry -> core -> ledger / driver / transport / config -> common, with no
# include between the four middle layers and none back up. Inside core, the
# sides keep apart: core/import includes nothing of core/export or core/arena,
# core/export nothing of core/import, core/arena nothing of either; and core's
# own files stand above or below the sides, never both: no side includes
# what aggregates them (core/process_state.h, core/follow.h), and a file of
# core/ that a side includes (the driver door, stats, the identity, ...)
# includes no side, so no include runs back up; the tool (vmmipc-config) uses the layers
# below core only. Inside transport, the roles keep apart the same way:
# transport/client and transport/serve include nothing of each other,
# transport/reaper nothing of either, and the shared base (transport/'s own
# files) nothing of any role. Checks every #include "layer/..." of csrc/.
# Usage: layer_includes.sh SRC_DIR
set -euo pipefail
src=$1
declare -A allowed=(
  [entry]="entry core common"
  [core]="core ledger driver transport config common"
  [ledger]="ledger common"
  [driver]="driver common"
  [transport]="transport common"
  [config]="config common"
  [common]="common"
  [tool]="tool config driver transport common"
)
# The sides of core, and the sides each may not include.
declare -A forbidden_sides=(
  [export]="import"
  [import]="export arena"
  [arena]="export import"
)
# The roles of transport, and the roles each may not include; the base is
# transport/'s own files (not in a role folder).
declare -A forbidden_roles=(
  [client]="serve"
  [serve]="client"
  [reaper]="client serve"
)
failed=0
for layer in "${!allowed[@]}"; do
  while IFS= read -r file; do
    while IFS= read -r line; do
      target=$(sed -E 's/^#include "([a-z_]+)\/.*/\1/' <<<"$line")
      if [[ " ${allowed[$layer]} " != *" $target "* ]]; then
        echo "FAIL ${file#"$src"/}: $line ($layer may include ${allowed[$layer]})"
        failed=1
      fi
    done < <(grep -E '^#include "[a-z_]+/' "$file" || true)
  done < <(find "$src/csrc/$layer" -type f)
done
for side in "${!forbidden_sides[@]}"; do
  [ -d "$src/csrc/core/$side" ] || { echo "FAIL csrc/core/$side is missing"; failed=1; continue; }
  for other in ${forbidden_sides[$side]}; do
    while IFS= read -r hit; do
      echo "FAIL ${hit#"$src"/} (core/$side may not include core/$other)"
      failed=1
    done < <(grep -rnE "^#include \"core/$other/" "$src/csrc/core/$side" || true)
  done
done
# core/'s own headers above the sides (they include the sides).
above_sides="core/process_state.h core/follow.h"
for side in export import arena; do
  for header in $above_sides; do
    while IFS= read -r hit; do
      echo "FAIL ${hit#"$src"/} (core/$side may not include $header, which stands above the sides)"
      failed=1
    done < <(grep -rnF "#include \"$header\"" "$src/csrc/core/$side" || true)
  done
done
# core/'s own files that a side includes, with their sources: none includes a side.
below_sides=$(grep -rhoE '^#include "core/[a-z_]+\.h"' "$src/csrc/core/export" "$src/csrc/core/import" \
  "$src/csrc/core/arena" | sed -E 's/^#include "core\/([a-z_]+)\.h"/\1/' | sort -u)
for name in $below_sides; do
  for file in "$src/csrc/core/$name.h" "$src/csrc/core/$name.cc"; do
    [ -f "$file" ] || continue
    while IFS= read -r hit; do
      echo "FAIL ${file#"$src"/}:$hit (a side includes core/$name.h: it may include no side)"
      failed=1
    done < <(grep -nE '^#include "core/(export|import|arena)/' "$file" || true)
  done
done
for role in "${!forbidden_roles[@]}"; do
  [ -d "$src/csrc/transport/$role" ] || { echo "FAIL csrc/transport/$role is missing"; failed=1; continue; }
  for other in ${forbidden_roles[$role]}; do
    while IFS= read -r hit; do
      echo "FAIL ${hit#"$src"/} (transport/$role may not include transport/$other)"
      failed=1
    done < <(grep -rnE "^#include \"transport/$other/" "$src/csrc/transport/$role" || true)
  done
done
while IFS= read -r hit; do
  echo "FAIL ${hit#"$src"/} (transport's base may include no role: client, serve, reaper)"
  failed=1
done < <(grep -nE '^#include "transport/(client|serve|reaper)/' "$src"/csrc/transport/*.h "$src"/csrc/transport/*.cc || true)
((failed == 0)) && echo "every include of csrc/ follows the layers, core's sides (none back up) and transport's roles"
exit "$failed"
