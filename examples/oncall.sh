#!/usr/bin/env bash
# An on-call session with dlockctl: a worker (stuck_holder) holds
# "invoice:7" and never lets go; the operator lists the held locks, looks at
# the stuck one and releases it by force; the worker learns at once and
# stops. Needs a redis-server on the Unix socket given.
#   examples/oncall.sh DLOCKCTL STUCK_HOLDER UNIX_SOCKET
set -euo pipefail
ctl=$1 holder=$2 sock=$3
"$holder" -s "$sock" >"${TMPDIR:-/tmp}/stuck_holder.$$" 2>&1 &
pid=$!
for i in $(seq 100); do
  grep -q "holding invoice:7" "${TMPDIR:-/tmp}/stuck_holder.$$" && break
  sleep 0.05
done
echo '$ dlockctl list'
"$ctl" -s "$sock" --prefix example: list
echo '$ dlockctl show invoice:7'
"$ctl" -s "$sock" --prefix example: show invoice:7
echo '$ dlockctl release invoice:7 --force'
"$ctl" -s "$sock" --prefix example: release invoice:7 --force
status=0
wait "$pid" || status=$?
echo '-- the worker:'
cat "${TMPDIR:-/tmp}/stuck_holder.$$"
rm -f "${TMPDIR:-/tmp}/stuck_holder.$$"
exit "$status"
