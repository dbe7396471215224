#!/bin/bash
# BIN NAME CORES PORT: perf record + perf stat of the gateway during an unbounded fan-out
set -u
B=$1; N=$2; C=$3; PORT=$4; L=/work/wt-mesh/target/release/stompgate-load
$B --stomp-addr 127.0.0.1:$PORT --stomp-tls-addr off --ws-addr off --amqp-addr off --amqp-tls-addr off --grpc-addr off --store-dir off --cores $C > $N.gw.log 2>&1 &
P=$!
for i in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
$L fanout --subscribers 4 --rate 0 --receipt-every 1000 --port $PORT --duration-s 10 --warmup-s 1 --json --quiet --name pf-$N > $N.load.json 2>$N.load.err &
LP=$!
sleep 2
perf stat -e task-clock,context-switches,cpu-migrations -p $P -- sleep 6 2> $N.stat.txt &
perf record -F 999 -g -o $N.perf.data -p $P -- sleep 6 > /dev/null 2>&1
wait $LP
kill $P; wait $P
