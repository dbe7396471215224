// @stomp/stompjs (the STOMP client of most web applications) with the `ws` WebSocket library
// in Node, against a real stompgate over WebSocket: events, a queue with ack, receipts, a
// 1 MiB body split over WebSocket messages, a binary body, heart-beats.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@stomp/stompjs';
import WebSocket from 'ws';
import { startGateway } from './gateway.mjs';

let gw;
let n = 0;
const unique = (prefix) => `${prefix}-${process.pid}-${n++}`;
const WAIT_MS = 5000;

before(async () => { gw = await startGateway(['--heartbeat-ms', '500']); });
after(async () => { await gw?.stop(); });

/** A connected stompjs client; `opts` are stompjs options (heart-beats, splitting). */
function connect(opts = {}) {
  return new Promise((resolve, reject) => {
    const protocols = [];
    const client = new Client({
      webSocketFactory: () => {
        const ws = new WebSocket(gw.url, ['v12.stomp', 'v11.stomp', 'v10.stomp']);
        // Counts what stompjs sends, and can silence it (`muted`) to play a dead client.
        const send = ws.send.bind(ws);
        ws.sends = 0;
        ws.send = (...args) => {
          if (ws.muted) return undefined;
          ws.sends += 1;
          ws.lastSendAt = Date.now();
          return send(...args);
        };
        client.ws = ws;
        ws.on('open', () => protocols.push(ws.protocol));
        return ws;
      },
      reconnectDelay: 0,
      heartbeatIncoming: 0,
      heartbeatOutgoing: 0,
      ...opts,
      onConnect: (frame) => { client.connectedFrame = frame; client.protocols = protocols; resolve(client); },
      onStompError: (frame) => reject(new Error(`STOMP ERROR: ${frame.headers.message}`)),
      onWebSocketError: (e) => reject(e),
    });
    client.activate();
    setTimeout(() => reject(new Error('no CONNECTED within the wait')), WAIT_MS);
  });
}

/** Resolves with the next message of a subscription to `destination`. */
function nextMessage(client, destination, headers = {}) {
  return new Promise((resolve, reject) => {
    const sub = client.subscribe(destination, (m) => resolve({ m, sub }), headers);
    setTimeout(() => reject(new Error(`no message on ${destination} within the wait`)), WAIT_MS);
  });
}

/** Publishes with a receipt and resolves once the gateway has confirmed it. */
function publishConfirmed(client, params) {
  return new Promise((resolve, reject) => {
    const receipt = unique('r');
    client.watchForReceipt(receipt, (frame) => resolve(frame));
    client.publish({ ...params, headers: { ...(params.headers || {}), receipt } });
    setTimeout(() => reject(new Error(`no RECEIPT ${receipt} within the wait`)), WAIT_MS);
  });
}

/** Subscribes with a receipt as the barrier: once it resolves, the subscription is in place. */
function subscribeConfirmed(client, destination, onMessage, headers = {}) {
  return new Promise((resolve, reject) => {
    const receipt = unique('sub');
    client.watchForReceipt(receipt, () => resolve());
    client.subscribe(destination, onMessage, { ...headers, receipt });
    setTimeout(() => reject(new Error('no RECEIPT for SUBSCRIBE within the wait')), WAIT_MS);
  });
}

test('the v12.stomp subprotocol is chosen and STOMP 1.2 negotiated', async () => {
  const c = await connect();
  assert.deepEqual(c.protocols, ['v12.stomp']);
  assert.equal(c.connectedFrame.headers.version, '1.2');
  await c.deactivate();
});

test('events reach a subscriber, confirmed by a receipt', async () => {
  const [sub, pub] = [await connect(), await connect()];
  const dest = `/topic/${unique('js-ev')}`;
  const got = new Promise((resolve) => { subscribeConfirmed(sub, dest, resolve).then(() => publishConfirmed(pub, { destination: dest, body: 'hello from stompjs' })); });
  const m = await got;
  assert.equal(m.body, 'hello from stompjs');
  assert.equal(m.headers.destination, dest);
  await Promise.all([sub.deactivate(), pub.deactivate()]);
});

test('a queue message acknowledged is not delivered again', async () => {
  const c = await connect();
  const dest = `/queue/${unique('js-q')}`;
  await publishConfirmed(c, { destination: dest, body: 'first' });
  const { m, sub } = await nextMessage(c, dest, { ack: 'client-individual' });
  assert.equal(m.body, 'first');
  await new Promise((resolve) => {
    const receipt = unique('ack');
    c.watchForReceipt(receipt, resolve);
    m.ack({ receipt });
  });
  sub.unsubscribe();
  await c.deactivate();
  // A new consumer sees the next message, not the acknowledged one again.
  const d = await connect();
  await publishConfirmed(d, { destination: dest, body: 'second' });
  const next = await nextMessage(d, dest, { ack: 'client-individual' });
  assert.equal(next.m.body, 'second');
  next.m.ack();
  await d.deactivate();
});

test('an unacknowledged queue message is redelivered after the client goes', async () => {
  const c = await connect();
  const dest = `/queue/${unique('js-redeliver')}`;
  await publishConfirmed(c, { destination: dest, body: 'keep me' });
  const { m } = await nextMessage(c, dest, { ack: 'client-individual' });
  assert.equal(m.body, 'keep me');
  await c.deactivate();
  const d = await connect();
  const again = await nextMessage(d, dest, { ack: 'client-individual' });
  assert.equal(again.m.body, 'keep me');
  assert.equal(again.m.headers.redelivered, 'true');
  again.m.ack();
  await d.deactivate();
});

test('a 1 MiB body split over WebSocket messages arrives whole', async () => {
  // stompjs splits the outgoing frame into 64 KiB WebSocket messages; the gateway reassembles.
  const pub = await connect({ splitLargeFrames: true, maxWebSocketChunkSize: 64 * 1024 });
  const sub = await connect();
  const dest = `/topic/${unique('js-big')}`;
  const body = Array.from({ length: 1024 * 1024 }, (_, i) => String.fromCharCode(97 + (i % 26))).join('');
  const sendsBefore = pub.ws.sends;
  const got = new Promise((resolve) => subscribeConfirmed(sub, dest, resolve).then(() => pub.publish({ destination: dest, body })));
  const m = await got;
  assert.equal(m.body.length, body.length);
  assert.equal(m.body, body);
  const sent = pub.ws.sends - sendsBefore;
  assert.ok(sent >= 16, `the frame went out in ${sent} WebSocket messages (expected >= 16)`);
  await Promise.all([sub.deactivate(), pub.deactivate()]);
});

test('a binary body arrives byte for byte', async () => {
  const [sub, pub] = [await connect(), await connect()];
  const dest = `/queue/${unique('js-bin')}`;
  const bytes = new Uint8Array(256).map((_, i) => i);
  const got = new Promise((resolve) => subscribeConfirmed(sub, dest, resolve).then(() => pub.publish({
    destination: dest, binaryBody: bytes, headers: { 'content-type': 'application/octet-stream' },
  })));
  const m = await got;
  assert.deepEqual(Array.from(m.binaryBody), Array.from(bytes));
  await Promise.all([sub.deactivate(), pub.deactivate()]);
});

test('heart-beats flow both ways and keep an idle connection open', async () => {
  let pongs = 0;
  let closed = false;
  const c = await connect({
    heartbeatIncoming: 500,
    heartbeatOutgoing: 500,
    debug: (line) => { if (line === '<<< PONG') pongs += 1; },
    onWebSocketClose: () => { closed = true; },
  });
  assert.equal(c.connectedFrame.headers['heart-beat'], '500,500');
  await new Promise((r) => setTimeout(r, 3000));
  assert.equal(closed, false, 'the gateway kept the heart-beating client');
  // 3 s at one beat per 500 ms: about 6; at least 3 leaves room for a slow machine.
  assert.ok(pongs >= 3, `only ${pongs} heart-beats from the gateway in 3 s`);
  await c.deactivate();
});

test('a client that stops heart-beating is cut off', async () => {
  let closedAt = 0;
  const c = await connect({ heartbeatIncoming: 0, heartbeatOutgoing: 500, onWebSocketClose: () => { closedAt = Date.now(); } });
  // Stop our beats without telling the gateway: it expects one every 500 ms, and closes
  // after twice that of silence.
  c.ws.muted = true;
  const lastBeat = c.ws.lastSendAt;
  await new Promise((r) => setTimeout(r, 3000));
  assert.ok(closedAt > 0, 'the gateway closed the silent connection');
  assert.ok(closedAt - lastBeat >= 1000, `closed ${closedAt - lastBeat} ms after the last beat, sooner than twice the 500 ms`);
  await c.deactivate();
});
