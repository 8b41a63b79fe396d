#!/usr/bin/env bash
# One scheduled run of the dedup job: run id = today's date in UTC, never two runs at once
# (flock), everything appended to one log file. Used by crontab.example and
# tensordedup.service next to this file; any variable below can be set by the caller.
#
# Exit status: the job's (0 done, 1 failed, 2 bad config or input), 75 when another run
# still holds the lock (this one is skipped, so a scheduler or monitor sees it), or 78 when
# the setup is wrong (TENSORDEDUP_HOME not a directory, no python at TENSORDEDUP_PYTHON,
# the log or the lock file cannot be opened). Every outcome is a line in the log; one the
# log cannot take goes to stderr (the journal, cron's mail).
set -euo pipefail

EXIT_SETUP=78  # sysexits' EX_CONFIG: not the job's 1 or 2, which mean it ran (or checked)

TENSORDEDUP_HOME=${TENSORDEDUP_HOME:-/srv/tensordedup}      # checkout with its .venv
TENSORDEDUP_CONFIG=${TENSORDEDUP_CONFIG:-configs/dedupe.yaml}  # relative to the checkout
TENSORDEDUP_PYTHON=${TENSORDEDUP_PYTHON:-$TENSORDEDUP_HOME/.venv/bin/python}
TENSORDEDUP_LOG=${TENSORDEDUP_LOG:-/var/log/tensordedup/run.log}
# systemd's RuntimeDirectory= (tensordedup.service) is the service user's own; elsewhere
# /run/lock, or set TENSORDEDUP_LOCK to a path the user that runs this can create
TENSORDEDUP_LOCK=${TENSORDEDUP_LOCK:-${RUNTIME_DIRECTORY:-/run/lock}/tensordedup.lock}
RUN_ID=${TENSORDEDUP_RUN_ID:-$(date -u +%F)}  # passed as typed: 0123 stays 0123

line() { echo "$(date -u +%FT%TZ) run $RUN_ID: $*"; }
log() { line "$@" >> "$TENSORDEDUP_LOG"; }
setup_error() {  # the line on stderr and, where it can be written, in the log; exit 78
    line "setup error: $*" >&2
    [[ -z ${no_log:-} ]] && log "setup error: $*" 2>/dev/null
    exit "$EXIT_SETUP"
}

if ! { mkdir -p "$(dirname "$TENSORDEDUP_LOG")" && : >> "$TENSORDEDUP_LOG"; } 2>/dev/null; then
    no_log=1
    setup_error "cannot write the log TENSORDEDUP_LOG=$TENSORDEDUP_LOG as $(id -un): make it" \
        "(and its folder) writable for this user, or set TENSORDEDUP_LOG"
fi
if ! cd "$TENSORDEDUP_HOME" 2>/dev/null; then
    setup_error "TENSORDEDUP_HOME=$TENSORDEDUP_HOME is not a directory this user can enter:" \
        "set it to the tensordedup checkout"
fi
if [[ ! -x $TENSORDEDUP_PYTHON ]]; then
    setup_error "TENSORDEDUP_PYTHON=$TENSORDEDUP_PYTHON is not an executable python: create" \
        "the checkout's .venv (docs/install.md), or set TENSORDEDUP_PYTHON"
fi
# The lock is opened for reading (all flock needs), created first where it is missing: a
# lock file another user left (a run by hand as root, mode 0644) still serves.
if ! { exec 9<"$TENSORDEDUP_LOCK" || { : >> "$TENSORDEDUP_LOCK" && exec 9<"$TENSORDEDUP_LOCK"; }
     } 2>/dev/null; then
    setup_error "cannot open or create the lock file TENSORDEDUP_LOCK=$TENSORDEDUP_LOCK as" \
        "$(id -un): set TENSORDEDUP_LOCK to a path this user can create (the systemd unit:" \
        "RuntimeDirectory=tensordedup and /run/tensordedup/tensordedup.lock)"
fi
if ! flock --nonblock 9; then  # held until this script and the job it runs exit
    log "skipped: another run holds $TENSORDEDUP_LOCK"
    exit 75
fi

log "started: $TENSORDEDUP_CONFIG"
status=0
"$TENSORDEDUP_PYTHON" -m pipeline.run --config "$TENSORDEDUP_CONFIG" --run-id "$RUN_ID" \
    --quiet "$@" >> "$TENSORDEDUP_LOG" 2>&1 || status=$?
log "finished: exit $status"
exit "$status"
