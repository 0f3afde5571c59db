#!/usr/bin/env bash
# The layers of docs/architecture.md include only downward along its arrows:
# entry -> core -> state / driver / transport / config -> common, with no
# include between the four middle layers and none back up. Inside core, the
# sides keep apart: core/import includes nothing of core/export or core/arena,
# core/export nothing of core/import, core/arena nothing of either; core/'s own
# files (process state, the driver door, stats, follow, the hooks that span
# sides) may include every side; the tool (vmmipc-config) uses the layers
# below core only. Checks every #include "layer/..." of csrc/.
# Usage: layer_includes.sh SRC_DIR
set -euo pipefail
src=$1
declare -A allowed=(
  [entry]="entry core common"
  [core]="core state driver transport config common"
  [state]="state common"
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
((failed == 0)) && echo "every include of csrc/ follows the layers and core's sides"
exit "$failed"
