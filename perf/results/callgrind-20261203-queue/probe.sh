#!/bin/bash
# BIN PORT CREDIT [DUR]: a 2-core gateway at full speed, uprobe counts over one AMQP queue run
B=$1; PORT=$2; CREDIT=$3; D=${4:-5}
$B --stomp-addr 127.0.0.1:$PORT --amqp-addr 127.0.0.1:$((PORT+1)) --stomp-tls-addr off --ws-addr off --amqp-tls-addr off --grpc-addr off --store-dir off --cores 2 > /tmp/qcost-cg/probe-gw.log 2>&1 &
P=$!
sleep 1
perf stat -e 'probe_qcost:*' -p $P -o /tmp/qcost-cg/probe-$PORT.stat &
S=$!
sleep 0.5
/tmp/qcost-load queue --protocol amqp --producers 2 --consumers 2 --rate 0 --receipt-every 1000 --amqp-topic-prefix events/ --amqp-queue-prefix queues/ --amqp-credit $CREDIT --port $((PORT+1)) --host 127.0.0.1 --duration-s $D --warmup-s 1 --json --quiet --server-pid $P > /tmp/qcost-cg/probe-$PORT.json
kill -INT $S; wait $S
kill $P; wait $P
python3 -c "import json;d=json.load(open('/tmp/qcost-cg/probe-$PORT.json'));print('credit $CREDIT', 'msgs', d['latency_count'], 'consumed/s', d['delivered_per_s'], 'cpu us/msg', d['server_cpu_us_per_msg'])"
grep probe_qcost /tmp/qcost-cg/probe-$PORT.stat
