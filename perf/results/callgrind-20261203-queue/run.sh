#!/bin/bash
# one callgrind run: BIN LABEL CASE(queue|amqp-queue) PORT [DURATION]
# the gateway under callgrind with --cores 1 --store-dir off, counters zeroed once it answers,
# one load run (no warm-up), then a dump.
set -u
cd /tmp/qcost-cg; B=$1; LBL=$2; CASE=$3; PORT=$4; D=${5:-10}; L=/tmp/qcost-load
valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=/tmp/qcost-cg/$LBL.callgrind $B \
  --stomp-addr 127.0.0.1:$PORT --amqp-addr 127.0.0.1:$((PORT+1)) --stomp-tls-addr off --ws-addr off --amqp-tls-addr off \
  --grpc-addr off --store-dir off --cores 1 > /tmp/qcost-cg/$LBL.vg.log 2>&1 &
P=$!
for i in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT+1))) 2>/dev/null && break; sleep 0.2; done
sleep 1
callgrind_control -z $P >/dev/null
case $CASE in
 queue) ARGS="queue --producers 2 --consumers 2 --rate 0 --receipt-every 1000 --port $PORT" ;;
 amqp-fanout) ARGS="fanout --protocol amqp --subscribers 4 --rate 0 --receipt-every 1000 --amqp-topic-prefix events/ --amqp-queue-prefix queues/ --port $((PORT+1))" ;;
 amqp-queue) ARGS="queue --protocol amqp --producers 2 --consumers 2 --rate 0 --receipt-every 1000 --amqp-topic-prefix events/ --amqp-queue-prefix queues/ --amqp-credit ${CREDIT:-10000} --port $((PORT+1))" ;;
esac
$L $ARGS --host 127.0.0.1 --duration-s $D --warmup-s 0 --json --quiet --name cg-$LBL > /tmp/qcost-cg/$LBL.load.json 2>/tmp/qcost-cg/$LBL.load.err
echo "load rc=$?"
callgrind_control -d $LBL $P >/dev/null
sleep 1
kill $P; wait $P
python3 -c "
import json,sys; d=json.load(open('/tmp/qcost-cg/$LBL.load.json')); print('$LBL', 'latency_count', d['latency_count'], 'sent', d['sent'], 'lost', d['lost'], 'dup', d['duplicated'])"
ls -la /tmp/qcost-cg/$LBL.callgrind*
