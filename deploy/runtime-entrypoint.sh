#!/bin/sh
# turnout-runtime: the warm pool container's main process, under tini (PID 1, see deploy/runtime.Dockerfile).
#
# Runs `turnout agent "$@"` and restarts it when it exits, so an agent crash does not take its engines with it:
# the agent starts each engine in its own session, the engines keep serving while no agent runs (tini adopts and
# reaps them), and the next agent re-adopts them from engines.json (same PIDs, ports and IPC names).
# SIGTERM/SIGINT (pod shutdown) is passed to the agent and ends the loop with the agent's exit status.
# Restarts back off from 1 s to 30 s; an agent that ran for 60 s or more resets the delay.
# TURNOUT_BIN names the turnout executable (default: turnout on PATH).
set -u

bin="${TURNOUT_BIN:-turnout}"
stopping=0
child=0
delay=1

on_signal() {
  stopping=1
  if [ "$child" -ne 0 ]; then kill -TERM "$child" 2>/dev/null; fi
}
trap on_signal TERM INT

while :; do
  started=$(date +%s)
  "$bin" agent "$@" &
  child=$!
  # `wait` returns early when a trapped signal arrives: wait until the agent itself is gone.
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=0
  if [ "$stopping" -eq 1 ]; then
    exit "$status"
  fi
  if [ $(( $(date +%s) - started )) -ge 60 ]; then delay=1; fi
  echo "turnout-runtime: the agent exited with status $status; restarting it in ${delay}s (engines keep running)" >&2
  sleep "$delay" &
  child=$!
  wait "$child"
  child=0
  if [ "$stopping" -eq 1 ]; then
    exit "$status"
  fi
  delay=$(( delay * 2 ))
  if [ "$delay" -gt 30 ]; then delay=30; fi
done
