#!/bin/bash
# one callgrind run: MODE (plain|auth) RUN
set -u
cd /tmp/cg; M=$1; R=$2; B=/work/main/target/release/stompgate; L=/work/main/target/release/stompgate-load
A=""; H=""
[ $M = auth ] && A="--auth-jwt-key /tmp/cg/jwt.key --auth-jwt-alg HS256" && H="--login stompgate-load --passcode-file /tmp/cg/token"
valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=/tmp/cg/$M-$R.callgrind $B --stomp-addr 127.0.0.1:61682 --stomp-tls-addr off --ws-addr off --amqp-addr off --amqp-tls-addr off --grpc-addr off --cores 1 $A > /tmp/cg/$M-$R.vg.log 2>&1 &
P=$!
for i in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/61682) 2>/dev/null && break; sleep 0.2; done
sleep 1
callgrind_control -z $P >/dev/null
$L fanout --subscribers 4 --rate 0 --receipt-every 1000 --port 61682 --duration-s 10 --warmup-s 0 --json --quiet --name cg-$M-$R $H > /tmp/cg/$M-$R.load.json 2>/tmp/cg/$M-$R.load.err
callgrind_control -d $M-$R $P >/dev/null
kill $P; wait $P
