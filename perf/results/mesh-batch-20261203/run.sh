#!/bin/bash
# one callgrind run: BIN NAME CORES CASE PORT
set -u
cd /tmp/mesh-cg; # the harness: stompgate-load of the tree measured
B=$1; N=$2; C=$3; CASE=$4; PORT=$5; L=/work/wt-mesh/target/release/stompgate-load
valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=/tmp/mesh-cg/$N.callgrind $B --stomp-addr 127.0.0.1:$PORT --stomp-tls-addr off --ws-addr off --amqp-addr off --amqp-tls-addr off --grpc-addr off --store-dir off --cores $C > /tmp/mesh-cg/$N.vg.log 2>&1 &
P=$!
for i in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.2; done
sleep 1
callgrind_control -z $P >/dev/null
if [ $CASE = fanout ]; then
timeout 120 $L fanout --subscribers 4 --rate 0 --receipt-every 1000 --port $PORT --duration-s 10 --warmup-s 0 --json --quiet --name cg-$N > /tmp/mesh-cg/$N.load.json 2>/tmp/mesh-cg/$N.load.err
else
timeout 120 $L queue --producers 2 --consumers 2 --rate 0 --receipt-every 1000 --port $PORT --duration-s 10 --warmup-s 0 --json --quiet --name cg-$N > /tmp/mesh-cg/$N.load.json 2>/tmp/mesh-cg/$N.load.err
fi
callgrind_control -d $N $P >/dev/null
kill $P; wait $P
