#!/usr/bin/env bash
# Peer brokers for scripts/compare.sh: install (Debian packages), configure for loopback-only STOMP,
# start in the background, stop.
#
#   scripts/peers.sh start PEER   install if needed, configure, start, wait for STOMP
#   scripts/peers.sh stop  PEER   stop it (no-op when not running)
#   scripts/peers.sh certs        make the TLS certificates below (if missing), print their dir
#   scripts/peers.sh port  PEER [tcp|tls|ws|amqp]   print its STOMP port over that transport
#                                 (default tcp), or its AMQP 1.0 port; exit 1 if it has none
#   scripts/peers.sh pid   PEER   print the broker's server process id (for --server-pid)
# PEER: rabbitmq, activemq, or activemq-kahadb (a second ActiveMQ instance, persistent).
#
# Ports (all on 127.0.0.1 only; stompgate keeps its default 61613):
#   rabbitmq  STOMP 61623 (plugin rabbitmq_stomp), STOMP over TLS 61624, Web-STOMP 15684
#             (plugin rabbitmq_web_stomp, path /ws; binary WebSocket frames, as its text default
#             cannot carry non-UTF-8 bodies), AMQP 1.0 and 0-9-1 5682 (plugin rabbitmq_amqp1_0,
#             which shares the AMQP 0-9-1 listener: moved off 5672, stompgate's AMQP port;
#             addresses /topic/X and /queue/X), epmd 4369, distribution 25672
#   activemq  STOMP 61633, STOMP over TLS 61634 (stomp+nio+ssl), AMQP 1.0 5692 (amqp+nio;
#             addresses topic://X and queue://X) only where the broker has its AMQP transport
#             (activemq-amqp and proton-j jars): Debian 12's activemq 5.17.2 package ships
#             neither (activemq_has_amqp below), so there it has no AMQP listener and
#             `port activemq amqp` fails saying so. Every other transport connector removed,
#             JMX connector off. No WebSocket: Debian's activemq package lacks the Jetty
#             WebSocket jars its ws:// connector needs.
#   activemq-kahadb  STOMP 61635 only: a second, separate ActiveMQ broker with persistence on
#             (persistent="true", KahaDB in $PEERS_DIR/activemq-kahadb-base/data/kahadb, its
#             defaults: the journal is synced (fdatasync) before a persistent message is
#             acknowledged, concurrent writes share a sync). A SEND with persistent:true and a
#             receipt is answered once its message is in the synced journal. It can run beside
#             `activemq` (which stays non-persistent).
# RabbitMQ needs no second instance for persistence: its STOMP plugin declares /queue/<name>
# durable (non-exclusive, not auto-deleted) unless told otherwise, a SEND with persistent:true
# publishes a persistent message, and the RECEIPT of such a SEND waits for the publisher confirm
# (the message is on disk) -- https://www.rabbitmq.com/docs/stomp, "Queue Destinations" and
# "Message Persistence".
# Override with RABBITMQ_STOMP_PORT / RABBITMQ_STOMP_TLS_PORT / RABBITMQ_WEB_STOMP_PORT /
# RABBITMQ_AMQP_PORT / ACTIVEMQ_STOMP_PORT / ACTIVEMQ_STOMP_TLS_PORT / ACTIVEMQ_AMQP_PORT /
# ACTIVEMQ_KAHADB_STOMP_PORT. All accept login guest/guest (RabbitMQ's
# default user, allowed from loopback; ActiveMQ has no authentication configured).
#
# TLS: at start, a throwaway CA and a server certificate it signs (EC P-256, for 127.0.0.1 and
# localhost) are made with openssl in $PEERS_DIR/tls (ca.pem, server.pem, server.key, and
# server.p12 for ActiveMQ's keystore), unless already there: a benchmark hands the same
# certificate to stompgate (--tls-cert/--tls-key) and ca.pem to the harness (--tls-ca), so every
# broker serves the same key. TLS 1.2 and 1.3, no client certificates.
#
# Logs and pid files: $PEERS_DIR (default /tmp/stompgate-peers). Needs root (apt-get, service
# users). A package missing from the configured apt sources is reported and exits non-zero.
set -euo pipefail

PEERS_DIR="${PEERS_DIR:-/tmp/stompgate-peers}"
RABBITMQ_STOMP_PORT="${RABBITMQ_STOMP_PORT:-61623}"
ACTIVEMQ_STOMP_PORT="${ACTIVEMQ_STOMP_PORT:-61633}"
RABBITMQ_STOMP_TLS_PORT="${RABBITMQ_STOMP_TLS_PORT:-61624}"
RABBITMQ_WEB_STOMP_PORT="${RABBITMQ_WEB_STOMP_PORT:-15684}"
ACTIVEMQ_STOMP_TLS_PORT="${ACTIVEMQ_STOMP_TLS_PORT:-61634}"
RABBITMQ_AMQP_PORT="${RABBITMQ_AMQP_PORT:-5682}"
ACTIVEMQ_AMQP_PORT="${ACTIVEMQ_AMQP_PORT:-5692}"
ACTIVEMQ_KAHADB_STOMP_PORT="${ACTIVEMQ_KAHADB_STOMP_PORT:-61635}"
TLS_DIR="$PEERS_DIR/tls"
# The PKCS#12 keystore's password (a throwaway certificate on loopback).
KEYSTORE_PASS=stompgate-peers
START_TIMEOUT_S="${START_TIMEOUT_S:-180}"

die() { echo "peers.sh: $*" >&2; exit 1; }
log() { echo "peers.sh: $*" >&2; }

# stomp_ready PORT: true when a STOMP CONNECT on 127.0.0.1:PORT is answered with CONNECTED.
stomp_ready() {
    timeout 3 bash -c '
        exec 3<>/dev/tcp/127.0.0.1/'"$1"' || exit 1
        printf "CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\nheart-beat:0,0\n\n\0" >&3
        IFS= read -r line <&3 || exit 1
        printf "DISCONNECT\n\n\0" >&3
        [ "${line%$'"'"'\r'"'"'}" = CONNECTED ]
    ' 2>/dev/null
}

wait_ready() { # NAME PORT PID_CHECK_CMD
    local name="$1" port="$2" deadline=$((SECONDS + START_TIMEOUT_S))
    while ! stomp_ready "$port"; do
        if ((SECONDS >= deadline)); then
            die "$name did not answer STOMP on 127.0.0.1:$port within ${START_TIMEOUT_S}s (log: $PEERS_DIR/$name.log)"
        fi
        if ! eval "$3"; then
            die "$name exited during start-up (log: $PEERS_DIR/$name.log)"
        fi
        sleep 1
    done
    log "$name answers STOMP on 127.0.0.1:$port"
}

# apt_install PKG: install PKG from Debian without letting its maintainer scripts start the service.
apt_install() {
    local pkg="$1"
    if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" = "install ok installed" ]; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "installing $pkg needs root"
    # Captured first: with pipefail, `apt-cache | grep -q` fails when grep exits early.
    local policy_out
    policy_out="$(apt-cache policy "$pkg" 2>/dev/null || true)"
    if ! grep -q 'Candidate: [0-9]' <<<"$policy_out"; then
        apt-get update -qq >&2 || true
        policy_out="$(apt-cache policy "$pkg" 2>/dev/null || true)"
    fi
    if ! grep -q 'Candidate: [0-9]' <<<"$policy_out"; then
        die "package $pkg is not available from the configured apt sources (apt-cache policy $pkg shows no candidate); cannot start this peer"
    fi
    # policy-rc.d exit 101 = "action forbidden": the package installs, its service does not start.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        made_policy=1
    fi
    log "installing $pkg (apt-get; this can take a few minutes)"
    local rc=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" \
        >"$PEERS_DIR/apt-$pkg.log" 2>&1 || rc=$?
    [ "$made_policy" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install $pkg failed (rc=$rc, log: $PEERS_DIR/apt-$pkg.log)"
}

# make_certs: the CA and the server certificate of the header, once per $PEERS_DIR.
make_certs() {
    [ -f "$TLS_DIR/server.p12" ] && return 0
    mkdir -p "$TLS_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=stompgate peers CA" \
        -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.pem" -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$TLS_DIR/server.key" -out "$TLS_DIR/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$TLS_DIR/server.ext"
    openssl x509 -req -in "$TLS_DIR/server.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" -CAcreateserial \
        -days 30 -extfile "$TLS_DIR/server.ext" -out "$TLS_DIR/server.pem" 2>/dev/null
    openssl pkcs12 -export -in "$TLS_DIR/server.pem" -inkey "$TLS_DIR/server.key" -name server \
        -out "$TLS_DIR/server.p12" -passout "pass:$KEYSTORE_PASS"
    # The brokers run as their own users (rabbitmq): the files must be readable by them.
    chmod 755 "$TLS_DIR"
    chmod 644 "$TLS_DIR"/*
    log "made a CA and a server certificate in $TLS_DIR"
}

# ---------------------------------------------------------------------------------------- rabbitmq

rabbitmq_running() { pgrep -u rabbitmq -f 'beam.*rabbit' >/dev/null 2>&1; }

rabbitmq_start() {
    apt_install rabbitmq-server
    make_certs
    if rabbitmq_running; then
        log "rabbitmq already running"
        wait_ready rabbitmq "$RABBITMQ_STOMP_PORT" rabbitmq_running
        return
    fi
    mkdir -p /etc/rabbitmq
    # Every listener on loopback; epmd and Erlang distribution too.
    cat >/etc/rabbitmq/rabbitmq-env.conf <<EOF
# written by stompgate scripts/peers.sh
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
    cat >/etc/rabbitmq/rabbitmq.conf <<EOF
# written by stompgate scripts/peers.sh
listeners.tcp.default = 127.0.0.1:$RABBITMQ_AMQP_PORT
amqp1_0.default_user = guest
stomp.listeners.tcp.1 = 127.0.0.1:$RABBITMQ_STOMP_PORT
stomp.listeners.ssl.1 = 127.0.0.1:$RABBITMQ_STOMP_TLS_PORT
stomp.default_user = guest
stomp.default_pass = guest
ssl_options.cacertfile = $TLS_DIR/ca.pem
ssl_options.certfile = $TLS_DIR/server.pem
ssl_options.keyfile = $TLS_DIR/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2
web_stomp.tcp.ip = 127.0.0.1
web_stomp.tcp.port = $RABBITMQ_WEB_STOMP_PORT
web_stomp.ws_frame = binary
loopback_users.guest = true
EOF
    ERL_EPMD_ADDRESS=127.0.0.1 rabbitmq-plugins enable --offline rabbitmq_stomp rabbitmq_web_stomp rabbitmq_amqp1_0 >&2
    log "starting rabbitmq (STOMP 127.0.0.1:$RABBITMQ_STOMP_PORT, TLS :$RABBITMQ_STOMP_TLS_PORT, Web-STOMP :$RABBITMQ_WEB_STOMP_PORT/ws, AMQP 1.0 :$RABBITMQ_AMQP_PORT)"
    # The idle scenario holds thousands of connections: the broker inherits the hard limit.
    # Debian's wrapper drops to the rabbitmq user through su, whose PAM session resets the
    # limit to 1024; setpriv changes user without PAM.
    ulimit -n "$(ulimit -Hn)" || true
    if command -v setpriv >/dev/null 2>&1; then
        (cd /var/lib/rabbitmq && HOME=/var/lib/rabbitmq ERL_EPMD_ADDRESS=127.0.0.1 \
            exec setsid nohup setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
            /usr/lib/rabbitmq/bin/rabbitmq-server) >"$PEERS_DIR/rabbitmq.log" 2>&1 </dev/null &
    else
        log "setpriv not found: rabbitmq will run with its user's default file limit"
        ERL_EPMD_ADDRESS=127.0.0.1 setsid nohup rabbitmq-server >"$PEERS_DIR/rabbitmq.log" 2>&1 </dev/null &
    fi
    echo $! >"$PEERS_DIR/rabbitmq.pid"
    sleep 2
    wait_ready rabbitmq "$RABBITMQ_STOMP_PORT" rabbitmq_running
}

rabbitmq_stop() {
    if ! command -v rabbitmqctl >/dev/null 2>&1 || ! rabbitmq_running; then
        log "rabbitmq not running"
    else
        log "stopping rabbitmq"
        timeout 60 rabbitmqctl stop >&2 || log "rabbitmqctl stop failed"
    fi
    # The server's own process tree, by the pid this script recorded.
    if [ -f "$PEERS_DIR/rabbitmq.pid" ]; then
        local pid
        pid="$(cat "$PEERS_DIR/rabbitmq.pid")"
        for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && kill -- "-$pid" 2>/dev/null || true
        rm -f "$PEERS_DIR/rabbitmq.pid"
    fi
    # epmd outlives the node; it was started for this peer.
    if command -v epmd >/dev/null 2>&1; then
        ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
    fi
}

# ---------------------------------------------------------------------------------------- activemq

# Which ActiveMQ instance the functions below act on: `activemq` (in memory, the compare.sh
# peer) or `activemq-kahadb` (persistent); set by main.
AMQ=activemq
amq_base() { echo "$PEERS_DIR/$AMQ-base"; }

# activemq_has_amqp: the broker's AMQP transport (activemq-amqp, which needs proton-j) is on its
# classpath. Without it an amqp+nio connector stops the whole broker from starting.
activemq_has_amqp() {
    compgen -G "/usr/share/activemq/lib/activemq-amqp*.jar" >/dev/null ||
        compgen -G "/usr/share/activemq/lib/optional/activemq-amqp*.jar" >/dev/null
}

activemq_pid() { cat "$PEERS_DIR/$AMQ.pid" 2>/dev/null; }
activemq_running() { local p; p="$(activemq_pid)" && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

activemq_start() {
    apt_install activemq
    make_certs
    local port="$ACTIVEMQ_STOMP_PORT" ACTIVEMQ_BASE
    ACTIVEMQ_BASE="$(amq_base)"
    [ "$AMQ" = activemq-kahadb ] && port="$ACTIVEMQ_KAHADB_STOMP_PORT"
    if activemq_running; then
        log "$AMQ already running"
        wait_ready "$AMQ" "$port" activemq_running
        return
    fi
    local home=/usr/share/activemq
    [ -d "$home" ] || die "activemq installed but $home is missing"
    # A private broker base: our own activemq.xml, data dir and log, nothing in /etc touched.
    rm -rf "$ACTIVEMQ_BASE"
    # The persistent instance: KahaDB with its defaults (journal synced before a persistent
    # message is acknowledged) and STOMP over TCP only, so it can run beside `activemq`.
    local PERSISTENT=false PERSISTENCE="" STORE_USAGE="" CONNECTORS
    if [ "$AMQ" = activemq-kahadb ]; then
        PERSISTENT=true
        PERSISTENCE="    <persistenceAdapter>
      <kahaDB directory=\"$ACTIVEMQ_BASE/data/kahadb\"/>
    </persistenceAdapter>
"
        STORE_USAGE="        <storeUsage><storeUsage limit=\"8 gb\"/></storeUsage>
"
    fi
    local AMQP_CONNECTOR=""
    if [ "$AMQ" = activemq-kahadb ]; then
        :
    elif activemq_has_amqp; then
        AMQP_CONNECTOR="      <transportConnector name=\"amqp\" uri=\"amqp+nio://127.0.0.1:$ACTIVEMQ_AMQP_PORT?maximumConnections=200000&amp;wireFormat.maxFrameSize=104857600\"/>
"
    else
        log "activemq: no AMQP transport (activemq-amqp/proton-j jars not in the package): no AMQP 1.0 listener"
    fi
    if [ "$AMQ" = activemq-kahadb ]; then
        CONNECTORS="      <transportConnector name=\"stomp\"
          uri=\"stomp+nio://127.0.0.1:$port?maximumConnections=200000&amp;wireFormat.maxFrameSize=104857600\"/>
"
    else
        CONNECTORS="      <transportConnector name=\"stomp\"
          uri=\"stomp+nio://127.0.0.1:$port?maximumConnections=200000&amp;wireFormat.maxFrameSize=104857600\"/>
      <transportConnector name=\"stomp-tls\"
          uri=\"stomp+nio+ssl://127.0.0.1:$ACTIVEMQ_STOMP_TLS_PORT?maximumConnections=200000&amp;wireFormat.maxFrameSize=104857600\"/>
$AMQP_CONNECTOR"
    fi
    mkdir -p "$ACTIVEMQ_BASE/conf" "$ACTIVEMQ_BASE/data" "$ACTIVEMQ_BASE/tmp"
    local conf_src
    for conf_src in /etc/activemq/instances-available/main /usr/share/activemq/conf /etc/activemq; do
        [ -f "$conf_src/log4j2.properties" ] && cp "$conf_src/log4j2.properties" "$ACTIVEMQ_BASE/conf/" && break
    done
    cat >"$ACTIVEMQ_BASE/conf/activemq.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- written by stompgate scripts/peers.sh ($AMQ): STOMP (plain and TLS) and AMQP 1.0 only (activemq-kahadb: STOMP only), loopback only, persistent=$PERSISTENT. -->
<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
       http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="stompgate-$AMQ"
          dataDirectory="$ACTIVEMQ_BASE/data" persistent="$PERSISTENT" useJmx="false"
          advisorySupport="false">
$PERSISTENCE
    <destinationPolicy>
      <policyMap>
        <policyEntries>
          <policyEntry topic=">" producerFlowControl="true">
            <pendingMessageLimitStrategy>
              <constantPendingMessageLimitStrategy limit="1000"/>
            </pendingMessageLimitStrategy>
          </policyEntry>
          <policyEntry queue=">" producerFlowControl="true"/>
        </policyEntries>
      </policyMap>
    </destinationPolicy>
    <managementContext>
      <managementContext createConnector="false"/>
    </managementContext>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <tempUsage><tempUsage limit="1 gb"/></tempUsage>
$STORE_USAGE      </systemUsage>
    </systemUsage>
    <sslContext>
      <sslContext keyStore="file:$TLS_DIR/server.p12" keyStorePassword="$KEYSTORE_PASS" keyStoreType="pkcs12"/>
    </sslContext>
    <transportConnectors>
$CONNECTORS    </transportConnectors>
  </broker>
</beans>
EOF
    local java
    java="$(command -v java || true)"
    [ -n "$java" ] || die "activemq installed but no java on PATH"
    # The broker's classpath: activemq.jar bootstraps from lib/ under activemq.home.
    local jar="$home/bin/activemq.jar"
    [ -f "$jar" ] || jar="$(find "$home" /usr/share/java -maxdepth 2 -name 'activemq.jar' 2>/dev/null | head -1)"
    [ -n "$jar" ] && [ -f "$jar" ] || die "activemq.jar not found under $home"
    if [ "$AMQ" = activemq-kahadb ]; then
        log "starting $AMQ (STOMP 127.0.0.1:$port, persistent, KahaDB in $ACTIVEMQ_BASE/data/kahadb)"
    else
        log "starting activemq (STOMP 127.0.0.1:$port, TLS :$ACTIVEMQ_STOMP_TLS_PORT${AMQP_CONNECTOR:+, AMQP 1.0 :$ACTIVEMQ_AMQP_PORT})"
    fi
    ulimit -n "$(ulimit -Hn)" || true
    setsid nohup "$java" -Xms512m -Xmx2g -Djava.awt.headless=true \
        -Djava.io.tmpdir="$ACTIVEMQ_BASE/tmp" \
        -Dactivemq.classpath="$ACTIVEMQ_BASE/conf" \
        -Dactivemq.home="$home" -Dactivemq.base="$ACTIVEMQ_BASE" \
        -Dactivemq.conf="$ACTIVEMQ_BASE/conf" -Dactivemq.data="$ACTIVEMQ_BASE/data" \
        -Dlog4j2.configurationFile="$ACTIVEMQ_BASE/conf/log4j2.properties" \
        -jar "$jar" start "xbean:file:$ACTIVEMQ_BASE/conf/activemq.xml" \
        >"$PEERS_DIR/$AMQ.log" 2>&1 </dev/null &
    echo $! >"$PEERS_DIR/$AMQ.pid"
    wait_ready "$AMQ" "$port" activemq_running
}

activemq_stop() {
    if ! activemq_running; then
        log "$AMQ not running"
        rm -f "$PEERS_DIR/$AMQ.pid"
        return
    fi
    local pid
    pid="$(activemq_pid)"
    log "stopping $AMQ (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        log "$AMQ ignored TERM for 30 s; killing pid $pid"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PEERS_DIR/$AMQ.pid"
}

# -------------------------------------------------------------------------------------------- main

if [ "${1:-}" = certs ]; then # the certificates alone (a benchmark's stompgate serves them too)
    mkdir -p "$PEERS_DIR"
    make_certs
    echo "$TLS_DIR"
    exit 0
fi
[ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$1" = port ]; } || die "usage: $0 start|stop|pid|port rabbitmq|activemq|activemq-kahadb [tcp|tls|ws|amqp], or $0 certs"
action="$1" peer="$2" transport="${3:-tcp}"
case "$peer" in
rabbitmq) impl=rabbitmq ;;
activemq | activemq-kahadb) impl=activemq AMQ="$peer" ;;
*) die "unknown peer '$peer' (rabbitmq, activemq or activemq-kahadb)" ;;
esac
mkdir -p "$PEERS_DIR"
case "$action" in
start) "${impl}_start" ;;
stop) "${impl}_stop" ;;
pid)
    case "$peer" in
    rabbitmq) pgrep -u rabbitmq -o beam.smp ;;
    *) activemq_pid ;;
    esac
    ;;
port)
    case "$peer:$transport" in
    rabbitmq:tcp) echo "$RABBITMQ_STOMP_PORT" ;;
    rabbitmq:tls) echo "$RABBITMQ_STOMP_TLS_PORT" ;;
    rabbitmq:ws) echo "$RABBITMQ_WEB_STOMP_PORT" ;;
    rabbitmq:amqp) echo "$RABBITMQ_AMQP_PORT" ;;
    activemq:tcp) echo "$ACTIVEMQ_STOMP_PORT" ;;
    activemq:tls) echo "$ACTIVEMQ_STOMP_TLS_PORT" ;;
    activemq-kahadb:tcp) echo "$ACTIVEMQ_KAHADB_STOMP_PORT" ;;
    activemq:amqp)
        activemq_has_amqp || die "activemq has no AMQP 1.0 listener here: its package lacks the AMQP transport (activemq-amqp and proton-j jars)"
        echo "$ACTIVEMQ_AMQP_PORT"
        ;;
    *) die "$peer has no listener over '$transport' here (tcp, tls, amqp; ws for rabbitmq)" ;;
    esac
    ;;
*) die "unknown action '$action' (start, stop, pid or port)" ;;
esac
