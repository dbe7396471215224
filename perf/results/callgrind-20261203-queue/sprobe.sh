#!/bin/bash
# BIN PORT [DUR]: a 2-core gateway at full speed, uprobe counts over one STOMP queue 2->2 run
B=$1; PORT=$2; D=${3:-5}
$B --stomp-addr 127.0.0.1:$PORT --amqp-addr off --stomp-tls-addr off --ws-addr off --amqp-tls-addr off --grpc-addr off --store-dir off --cores 2 > /tmp/qcost-cg/sprobe-gw.log 2>&1 &
P=$!
sleep 1
perf stat -e 'probe_qcost:*' -p $P -o /tmp/qcost-cg/sprobe-$PORT.stat &
S=$!
sleep 0.5
/tmp/qcost-load queue --producers 2 --consumers 2 --rate 0 --receipt-every 1000 --port $PORT --host 127.0.0.1 --duration-s $D --warmup-s 1 --json --quiet --server-pid $P > /tmp/qcost-cg/sprobe-$PORT.json 2>/dev/null
kill -INT $S; wait $S
kill $P; wait $P
python3 -c "import json;d=json.load(open('/tmp/qcost-cg/sprobe-$PORT.json'));print('$B', 'msgs', d['latency_count'], 'consumed/s', d['delivered_per_s'], 'cpu us/msg', d['server_cpu_us_per_msg'])"
grep probe_qcost /tmp/qcost-cg/sprobe-$PORT.stat | grep -v "  0  "
