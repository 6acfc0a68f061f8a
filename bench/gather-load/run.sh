#!/bin/bash
# Write gathering under load (docs/benchmarks.md): sequential 4 KiB writes
# at QD32 with fio's nbd engine against `vmsan serve`, optionally with busy
# loops competing for the CPUs and optionally replicated (protocol C) to a
# second `vmsan serve`; prints the load average and the engine counters of
# the primary (and secondary): [mean backend write KiB, backend ops,
# GatherTimeouts, Held].
#
#   go build -o /tmp/vmsan ./cmd/vmsan
#   bench/gather-load/run.sh /tmp/vmsan BUSY(0|2) REPL(0|1) [SIZE] [LABEL]
#
# Needs fio (with the nbd engine), nbdinfo and jq; ports come from
# 25000-25999. Stops every process it started. Exits non-zero
# when the pair does not sync, fio fails or a figure is missing.
BIN=$1; BUSY=$2; REPL=$3; SIZE=${4:-256M}; LABEL=$5
T=$(mktemp -d)
PA=; PB=; BPIDS=
trap 'kill $PA $PB $BPIDS 2>/dev/null; rm -rf "$T"' EXIT
# A port in 25000-25999 nothing listens on (a refused connect).
port() { for _ in $(seq 200); do p=$((25000 + RANDOM % 1000)); if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo $p; return; fi; done; echo "gather-load: no free port" >&2; exit 1; }
A=$T/a; B=$T/b; CFGA=; CFGB=; if [ -n "$GD" ]; then printf "engine:\n  gather_delay: $GD\n" > $T/cfg.yaml; CFGA="--config $T/cfg.yaml"; CFGB="--config $T/cfg.yaml"; fi; NA=$(port); NB=$(port)
$BIN volume create vol --size $SIZE --data-dir $A >/dev/null
if [ $REPL = 1 ]; then
  RA=$(port); RB=$(port)
  $BIN volume create vol --size $SIZE --data-dir $B >/dev/null
  echo gather-load-shared-secret > $T/repl.secret
  $BIN repl configure vol --data-dir $A --listen 127.0.0.1:$RA --peer 127.0.0.1:$RB --dial yes --role primary --protocol C --shared-secret-file $T/repl.secret >/dev/null
  $BIN repl configure vol --data-dir $B --listen 127.0.0.1:$RB --peer 127.0.0.1:$RA --dial no --role secondary --protocol C --shared-secret-file $T/repl.secret >/dev/null
fi
$BIN serve $CFGA --data-dir $A --listen 127.0.0.1:$NA --log-level error >/dev/null & PA=$!
PB=
if [ $REPL = 1 ]; then
  $BIN serve $CFGB --data-dir $B --listen 127.0.0.1:$NB --log-level error >/dev/null & PB=$!
  # In sync: Connected with both disks UpToDate (repl status --json).
  ok=
  for i in $(seq 600); do
    if $BIN repl status vol --json --data-dir $A 2>/dev/null | jq -e '.[0] | .connection == "Connected" and .disk == "UpToDate" and .peer_disk == "UpToDate"' >/dev/null; then ok=1; break; fi
    sleep 0.1
  done
  if [ -z "$ok" ]; then echo "gather-load: replication did not connect and sync within 60 s" >&2; $BIN repl status vol --data-dir $A >&2; exit 1; fi
else
  ok=
  for i in $(seq 100); do nbdinfo nbd://127.0.0.1:$NA/vol >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  if [ -z "$ok" ]; then echo "gather-load: vmsan serve did not answer on 127.0.0.1:$NA" >&2; exit 1; fi
fi
for i in $(seq $BUSY); do sh -c 'while :; do :; done' & BPIDS="$BPIDS $!"; done
sleep 0.5
L=$(cut -d' ' -f1 /proc/loadavg)
if ! fio --name=seq4k --ioengine=nbd --uri=nbd://127.0.0.1:$NA/vol --rw=write --bs=4k --iodepth=32 --size=$SIZE --output-format=json > $T/fio.json 2>$T/fio.err; then
  echo "gather-load: fio failed:" >&2; cat $T/fio.err >&2; exit 1
fi
L2=$(cut -d' ' -f1 /proc/loadavg)
for p in $BPIDS; do kill $p; done
IOPS=$(sed -n '/^{/,$p' $T/fio.json | jq '.jobs[0].write.iops|floor')
MA=$($BIN status --json --data-dir $A | jq -c '[.volumes[]|select(.name=="vol")|.engine|[(.mean_write_bytes/1024|floor), .backend_ops, .raw.gather_timeouts, .raw.held]][0]')
MB=-
if [ $REPL = 1 ]; then MB=$($BIN status --json --data-dir $B | jq -c '[.volumes[]|select(.name=="vol")|.engine|[(.mean_write_bytes/1024|floor), .backend_ops, .raw.gather_timeouts, .raw.held]][0]'); fi
# A broken run (a field renamed, a daemon gone) is an error, not a line of nulls.
case "$IOPS $MA $MB" in *null*|" "*|*"  "*) echo "gather-load: missing figures: iops=$IOPS primary=$MA secondary=$MB" >&2; exit 1;; esac
[ "$IOPS" -gt 0 ] 2>/dev/null || { echo "gather-load: iops=$IOPS" >&2; exit 1; }
echo "$LABEL busy=$BUSY repl=$REPL size=$SIZE load=$L..$L2 iops=$IOPS primary_mean_KiB=$MA secondary_mean_KiB=$MB"
kill $PA $PB 2>/dev/null; wait $PA $PB 2>/dev/null
rm -rf $T
