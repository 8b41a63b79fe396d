#!/usr/bin/env bash
# One scheduled run of the dedup job: run id = today's date in UTC, never two runs at once
# (flock), everything appended to one log file. Used by crontab.example and
# tensordedup.service next to this file; any variable below can be set by the caller.
#
# Exit status: the job's (0 done, 1 failed, 2 bad config or input), or 75 when another
# run still holds the lock (this one is skipped, so a scheduler or monitor sees it).
set -euo pipefail

TENSORDEDUP_HOME=${TENSORDEDUP_HOME:-/srv/tensordedup}      # checkout with its .venv
TENSORDEDUP_CONFIG=${TENSORDEDUP_CONFIG:-configs/dedupe.yaml}  # relative to the checkout
TENSORDEDUP_PYTHON=${TENSORDEDUP_PYTHON:-$TENSORDEDUP_HOME/.venv/bin/python}
TENSORDEDUP_LOG=${TENSORDEDUP_LOG:-/var/log/tensordedup/run.log}
TENSORDEDUP_LOCK=${TENSORDEDUP_LOCK:-/run/lock/tensordedup.lock}
RUN_ID=${TENSORDEDUP_RUN_ID:-$(date -u +%F)}

mkdir -p "$(dirname "$TENSORDEDUP_LOG")"
log() { echo "$(date -u +%FT%TZ) run $RUN_ID: $*" >> "$TENSORDEDUP_LOG"; }

exec 9>"$TENSORDEDUP_LOCK"  # held until this script and the job it runs exit
if ! flock --nonblock 9; then
    log "skipped: another run holds $TENSORDEDUP_LOCK"
    exit 75
fi

cd "$TENSORDEDUP_HOME"
log "started: $TENSORDEDUP_CONFIG"
status=0
"$TENSORDEDUP_PYTHON" -m pipeline.run --config "$TENSORDEDUP_CONFIG" --run-id "$RUN_ID" \
    --quiet "$@" >> "$TENSORDEDUP_LOG" 2>&1 || status=$?
log "finished: exit $status"
exit "$status"
