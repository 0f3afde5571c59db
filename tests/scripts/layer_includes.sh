#!/usr/bin/env bash
# The layers of docs/architecture.md include only downward along its arrows:
# entry -> core -> state / driver / transport / config -> common, with no
# include between the four middle layers and none back up. Checks every
# #include "layer/..." of csrc/. Usage: layer_includes.sh SRC_DIR
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
)
failed=0
for layer in "${!allowed[@]}"; do
  for file in "$src/csrc/$layer"/*; do
    while IFS= read -r line; do
      target=$(sed -E 's/^#include "([a-z_]+)\/.*/\1/' <<<"$line")
      if [[ " ${allowed[$layer]} " != *" $target "* ]]; then
        echo "FAIL ${file#"$src"/}: $line ($layer may include ${allowed[$layer]})"
        failed=1
      fi
    done < <(grep -E '^#include "[a-z_]+/' "$file" || true)
  done
done
((failed == 0)) && echo "every include of csrc/ follows the layers"
exit "$failed"
