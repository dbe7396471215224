#!/usr/bin/env python3
"""Writes the committed seed corpus of every fuzz target into fuzz/corpus/<target>/: a few real
frames, requests and header values, each a small file named for what it is. Re-run after
changing a target's input layout (see the comment at the top of each target)."""
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# ---- decode: first byte & 7 = how many piece sizes follow, then the wire bytes ----
FRAMES = {
    "connect-1.2": b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:localhost\nheart-beat:1000,2000\nlogin:u\npasscode:p\n\n\0",
    "stomp-1.1": b"STOMP\naccept-version:1.1\nhost:h\n\n\0",
    "send-receipt": b"SEND\ndestination:/queue/orders/new\nreceipt:r1\ncontent-type:text/plain\ncontent-length:5\n\nhello\0",
    "send-nul-body": b"SEND\ndestination:/topic/a\ncontent-length:3\n\na\0b\0",
    "subscribe-ack": b"SUBSCRIBE\nid:s1\ndestination:/topic/orders/*\nack:client-individual\n\n\0",
    "ack-nack": b"ACK\nid:m-1\n\n\0NACK\nid:m-2\ntransaction:t1\n\n\0",
    "escapes-crlf": b"SEND\r\ndestination:/queue/x\r\na\\cb:c\\\\d\\ne\\r\r\n\r\nbody\0",
    "heart-beats": b"\n\r\n\nDISCONNECT\nreceipt:bye\n\n\0\n",
    "transaction": b"BEGIN\ntransaction:t1\n\n\0SEND\ndestination:/queue/q\ntransaction:t1\n\nx\0COMMIT\ntransaction:t1\n\n\0",
    "rpc-request": b"SEND\ndestination:/command/exec\nreply-to:/reply/r1\ntimeout:5000\ncorrelation-id:c1\n\n{}\0",
    "store-subscribe": b"SUBSCRIBE\nid:2\ndestination:/topic-store/audit\nx-kubemq-start:sequence:5\n\n\0",
}
for name, frame in FRAMES.items():
    write("decode", name, b"\0" + frame)
# Two cut into pieces of 3 and 7 bytes.
write("decode", "cut-send", b"\x02\x03\x07" + FRAMES["send-receipt"])
write("decode", "cut-connect", b"\x01\x01" + FRAMES["connect-1.2"])


# ---- grpc_request: first byte % 7 picks the request type, then its protobuf encoding ----
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, wire_type, payload):
    return varint(number << 3 | wire_type) + payload


def s(number, value):
    value = value.encode() if isinstance(value, str) else value
    return field(number, 2, varint(len(value)) + value)


def i(number, value):
    return field(number, 0, varint(value))


def tags(number, pairs):
    return b"".join(s(number, s(1, k) + s(2, v)) for k, v in pairs)


EVENT = s(1, "e-1") + s(2, "client") + s(3, "orders.eu") + s(4, "meta") + s(5, b"\x00body\xff") + tags(7, [("k", "v"), ("stomp.type", "t")])
QUEUE_MESSAGE = s(1, "") + s(2, "client") + s(3, "jobs") + s(5, b"work") + tags(6, [("a", "1")])
POLICY = s(8, i(1, 60) + i(2, 1) + i(3, 3) + s(4, "jobs.dead"))
GRPC = {
    "event": b"\x00" + EVENT,
    "event-store": b"\x00" + EVENT + i(6, 1),
    "event-bad-channel": b"\x00" + s(2, "c") + s(3, "my orders"),
    "subscribe-events-wildcard": b"\x01" + i(1, 1) + s(2, "c") + s(3, "orders.*") + s(4, "g"),
    "subscribe-store-sequence": b"\x01" + i(1, 2) + s(2, "c") + s(3, "audit") + i(5, 4) + i(6, 5),
    "queue-message-policy": b"\x02" + QUEUE_MESSAGE + POLICY,
    "queue-batch": b"\x03" + s(1, "b1") + s(2, QUEUE_MESSAGE) + s(2, QUEUE_MESSAGE + POLICY),
    "request-query": b"\x04" + s(1, "r1") + i(2, 2) + s(3, "c") + s(4, "lookup") + s(6, b"q") + i(8, 5000) + tags(12, [("x", "y")]),
    "response": b"\x05" + s(1, "responder") + s(2, "r1") + s(3, "reply.r1") + s(5, b"ok") + i(7, 1700000000000000000) + i(8, 1) + s(9, "") + tags(11, [("t", "1")]),
    "pull": b"\x06" + s(1, "p1") + s(2, "c") + s(3, "jobs") + i(4, 10) + i(5, 1) + i(6, 0),
    "pull-negative": b"\x06" + s(2, "c") + s(3, "jobs") + i(4, -1) + i(5, -5),
}
for name, data in GRPC.items():
    write("grpc_request", name, data)

# ---- destination: flag byte (bits 0-1 default pattern, bit 2 subscribe), destination, LF, headers ----
DESTS = {
    "send-queue": (0, b"/queue/orders/new", b"content-type:text/plain\npriority:5\nx-custom:1\n"),
    "subscribe-wildcard": (4, b"/topic/orders/*/eu/>", b""),
    "bare-queues": (1, b"sensor/temp", b"correlation-id:c1\nreply-to:/reply/r\ntype:t\n"),
    "reply": (4, b"/reply/r1", b""),
    "alias-store": (2, b"/store/audit/2026", b"stomp.type:spoof\nx-kubemq-metadata:spoof\ndestination:/x\n"),
    "space": (0, b"/queue/my orders", b"a:b\na:dup\n"),
    "literal-dots": (0, b"/topic/a.b/c..d", b":empty-name\nname-only\n"),
    "none-default": (3, b"orders", b""),
}
for name, (flags, dest, headers) in DESTS.items():
    write("destination", name, bytes([flags]) + dest + b"\n" + headers)

# ---- connect_values: the raw header value ----
VALUES = {
    "heart-beat": b"10000,10000",
    "heart-beat-spaces": b" 0 , 18446744073709551615 ",
    "heart-beat-overflow": b"18446744073709551616,0",
    "accept-version": b"1.0,1.1,1.2",
    "accept-version-noise": b" 2.0 ,, 1.1 ",
    "start-sequence": b"sequence:5",
    "start-time-rfc3339": b"time:2023-11-14T23:13:20.5+01:00",
    "start-time-unix": b"time:1700000000",
    "start-delta": b"time-delta:10",
    "start-first": b"first",
}
for name, value in VALUES.items():
    write("connect_values", name, value)

# ---- session: mode byte (bit 0 complete else fail, bit 1 reverse order), then the wire bytes ----
CONNECT = FRAMES["connect-1.2"]
SESSIONS = {
    "publish-receipts": CONNECT + FRAMES["send-receipt"] + b"SEND\ndestination:/topic/a\nreceipt:r2\n\nx\0",
    "subscribe-ack": CONNECT + FRAMES["subscribe-ack"] + b"ACK\nid:q0-1\nreceipt:a\n\n\0UNSUBSCRIBE\nid:s1\n\n\0",
    "transaction": CONNECT + FRAMES["transaction"].replace(b"COMMIT\ntransaction:t1\n", b"COMMIT\ntransaction:t1\nreceipt:c\n"),
    "rpc": CONNECT + b"SUBSCRIBE\nid:r\ndestination:/reply/r1\n\n\0" + FRAMES["rpc-request"],
    "error-after-receipt": CONNECT + FRAMES["send-receipt"] + b"UNSUBSCRIBE\nid:nope\nreceipt:bad\n\n\0",
    "disconnect": CONNECT + FRAMES["heart-beats"],
    "before-connect": FRAMES["send-receipt"],
}
for name, wire in SESSIONS.items():
    for mode in (1, 3, 0):
        write("session", f"{name}-{mode}", bytes([mode]) + wire)


# ---- amqp_message: one whole AMQP message (its transfers' payloads joined), as
# python-qpid-proton's Message.encode() writes it ----
AMQP_MESSAGES = {
    "data-plain": b'\x00SpE\x00SsE\x00Sw\xa0\x05bytes',
    "value-typed": (b'\x00SpE\x00Sr\xd1\x00\x00\x00\x11\x00\x00\x00\x02\xa3\tx-opt-tagT\x02\x00Ss\xc0:\x0c@@@'
                    b'\xa1\x08greeting\xa1\x08queues/r\xa1\x03c-1\xa3\ntext/plain@@\x83\x00\x00\x01\x9a\xdb\x8c\\'
                    b'\xf4\xa1\x03g-1C\x00St\xd1\x00\x00\x00Q\x00\x00\x00\x0c\xa1\x01nT\xfb\xa1\x03big\x81\x00 '
                    b'\x00\x00\x00\x00\x00\x01\xa1\x04when\x83\x00\x00\x01\x9a\xdb\x8c[{\xa1\x02id\x98\x124Vx'
                    b'\x9a\xbc\xde\xf0\x01\x02\x03\x04\x05\x06\x07\x08\xa1\x03raw\xa0\x02\x00\xff\xa1\x04text'
                    b'\xa1\x05plain\x00Sw\xa1\x08typed \xc3\xbc'),
    "to-anonymous": b'\x00SpE\x00Ss\xc0\x10\x03S\x07@\xa1\nevents/a.b\x00Sw\xa0\x01x',
    "envelope": b'{"amqp10":{"app":{"n":{"$i32":-5},"t":{"$ts":1.5},"u":{"$uuid":"12345678-9abc-def0-0102-030405060708"}},"body_section":"value"}}',
}
for name, data in AMQP_MESSAGES.items():
    write("amqp_message", name, data)


# ---- log_scan: first byte % 4 = the scanned segment's stamp, then segment bytes ----
def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def log_bytes(b):
    return struct.pack("<I", len(b)) + b


def log_record(kind, stamp, fields, version=2):
    """One record as src/array/log/record.rs encodes it (version 1: no stamp)."""
    rest = bytes([version, kind]) + (struct.pack("<I", stamp) if version == 2 else b"") + fields
    framed = struct.pack("<I", len(rest)) + rest
    return b"SGR1" + struct.pack("<I", crc32c(framed)) + framed


def log_store_message(stamp, seq, body, version=2):
    content = log_bytes(b"id") + log_bytes(b"client") + log_bytes(b"") + log_bytes(body)
    content += struct.pack("<I", 1) + log_bytes(b"k") + log_bytes(b"v") + struct.pack("<q", seq)
    return log_record(5, stamp, log_bytes(b"prices") + struct.pack("<Q", seq) + content, version)


def log_queue_message(stamp, seq, body):
    content = log_bytes(b"m%d" % seq) + log_bytes(b"p") + log_bytes(b"") + log_bytes(body) + struct.pack("<I", 0) + struct.pack("<q", seq)
    policy = struct.pack("<qqI", 0, 0, 3) + b"\x01" + log_bytes(b"q.dlq") + b"\x00"
    return log_record(1, stamp, log_bytes(b"q") + struct.pack("<Q", seq) + content + policy)


LOG_NEW = (
    log_queue_message(1, 1, b"hello")
    + log_record(3, 1, log_bytes(b"q") + struct.pack("<QI", 1, 1))
    + log_record(2, 1, log_bytes(b"q") + struct.pack("<Q", 1))
    + log_store_message(1, 7, b"tick")
)
LOG_OLD = b"".join(log_store_message(2, 100 + i, b"old body %d" % i) for i in range(6))
write("log_scan", "clean", b"\x01" + LOG_NEW)
write("log_scan", "over-zeros", b"\x01" + LOG_NEW + bytes(64))
write("log_scan", "recycled", b"\x01" + LOG_NEW + bytes(16) + LOG_OLD[len(LOG_NEW) + 16 :])
write("log_scan", "torn-tail", b"\x01" + LOG_NEW + log_queue_message(1, 2, b"torn")[:20] + LOG_OLD[200:])
write("log_scan", "mid-damage", b"\x01" + LOG_NEW[:30] + b"\xff" + LOG_NEW[31:])
write("log_scan", "version-1", b"\x01" + log_store_message(0, 1, b"v1", version=1) + LOG_NEW)
