#!/usr/bin/env bash
# The relay drills of tests/drills.rs (lost replies, single server and
# cluster; the cluster acknowledgement drills), run N times in a row (default
# 50) while `stress --cpu 4` loads the machine: a drill that synchronises on
# anything but the relay's report fails here. Needs `stress` (apt-get install
# stress) and redis-server. Usage: bash scripts/drills.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-50}"
bin=$(cargo test --locked --test drills --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*drills[^"]*\)".*/\1/p' | tail -1)
stress --cpu 4 >/dev/null 2>&1 &
load=$!
trap 'kill $load 2>/dev/null || true' EXIT
passed=0
for i in $(seq 1 "$runs"); do
  if ! "$bin" --test-threads 2 a_lost_reply_is_not_resent \
      a_cluster_acknowledgement_needs_the_extractions_socket \
      a_cluster_wait_cut_short_is_not_sent_again \
      a_reconnect_between_an_extraction_and_its_wait_confirms_nothing >"/tmp/drill-$i.log" 2>&1; then
    echo "run $i failed: /tmp/drill-$i.log"
    exit 1
  fi
  passed=$((passed + 1))
done
echo "$passed runs of the 5 drills passed in a row under stress --cpu 4"
