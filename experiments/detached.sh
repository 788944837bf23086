#!/usr/bin/env bash
# GPU work longer than one call of a machine that ends each command within its time limit (and
# kills what the command leaves running, except a process in a session of its own):
#
#   bash experiments/detached.sh start DIR COMMAND [ARG...]   # COMMAND in a session of its own
#   bash experiments/detached.sh wait DIR SECONDS [DEST]       # until it ends or SECONDS pass
#   bash experiments/detached.sh stop DIR                      # kill COMMAND and all it started
#
# `start` returns at once; COMMAND's output goes to DIR/log, its process group to DIR/pgid, and
# its exit status, once it ends, to DIR/exit_status. `wait` prints how long COMMAND has run or how
# it ended, then copies DIR's files (not its folders) to DEST (default $OUT, so that a later call
# brings back what the command wrote so far); it exits 0 once COMMAND has ended, 3 while it runs.
# Each later call must come while the machine is still held, or COMMAND is lost with it.
set -u
usage() { sed -n '5,7p' "$0" | sed 's/^# *//'; exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$2
shift 2
case $action in
  start)
    [ $# -ge 1 ] || usage
    if [ -f "$dir/pgid" ] && [ ! -f "$dir/exit_status" ] && kill -0 -- "-$(cat "$dir/pgid")" 2>/dev/null; then
      echo "detached: $dir holds a command that still runs (process group $(cat "$dir/pgid"))" >&2
      exit 1
    fi
    mkdir -p "$dir"
    rm -f "$dir/exit_status" "$dir/pgid"
    date +%s > "$dir/started"
    # the wrapper leads a new session (setsid forks first where the caller leads its group):
    # its own pid is the group's id
    setsid bash -c 'echo $$ > "$0/pgid"; "$@"; echo $? > "$0/exit_status"' "$dir" "$@" \
      > "$dir/log" 2>&1 < /dev/null &
    for _ in $(seq 50); do [ -s "$dir/pgid" ] && break; sleep 0.1; done
    echo "detached: started process group $(cat "$dir/pgid"); output in $dir/log"
    ;;
  wait)
    [ $# -ge 1 ] || usage
    limit=$1 dest=${2:-${OUT:-}}
    [ -f "$dir/pgid" ] || { echo "detached: nothing was started in $dir" >&2; exit 1; }
    t0=$(date +%s)
    while [ ! -f "$dir/exit_status" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      kill -0 -- "-$(cat "$dir/pgid")" 2>/dev/null || break  # gone without a status: killed
      sleep 2
    done
    if [ -n "$dest" ]; then
      mkdir -p "$dest"
      find "$dir" -maxdepth 1 -type f -exec cp {} "$dest/" \;
    fi
    ran=$(( $(date +%s) - $(cat "$dir/started") ))
    if [ -f "$dir/exit_status" ]; then
      echo "detached: ended with status $(cat "$dir/exit_status") after $ran s"
      exit 0
    elif ! kill -0 -- "-$(cat "$dir/pgid")" 2>/dev/null; then
      echo "detached: killed after $ran s, without an exit status"
      exit 0
    fi
    echo "detached: still running after $ran s"
    exit 3
    ;;
  stop)
    [ -f "$dir/pgid" ] || { echo "detached: nothing was started in $dir" >&2; exit 1; }
    group=$(cat "$dir/pgid")
    # TERM first: a suite driver takes down the runs it started in sessions of their own
    kill -TERM -- "-$group" 2>/dev/null || { echo "detached: process group $group is not running"; exit 0; }
    for _ in $(seq 20); do kill -0 -- "-$group" 2>/dev/null || break; sleep 0.5; done
    kill -9 -- "-$group" 2>/dev/null
    echo "detached: stopped process group $group"
    ;;
  *) usage ;;
esac
