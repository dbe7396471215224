// @stomp/stompjs (the STOMP client of most web applications) with the `ws` WebSocket library
// in Node, against a real stompgate over WebSocket: events, events-store replay, a queue with
// ack, commands and queries answered by native gRPC responders (responder.mjs; STOMP is
// requester-only) and their failure replies, receipts, a 1 MiB body split over WebSocket
// messages, a binary body, heart-beats.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@stomp/stompjs';
import WebSocket from 'ws';
import { startGateway } from './gateway.mjs';
import { kubemqClient, responder, SUBSCRIBE_COMMANDS, SUBSCRIBE_QUERIES } from './responder.mjs';

let gw;
let kubemq; // a gRPC client of the gateway's KubeMQ API, for the RPC responders
let n = 0;
const unique = (prefix) => `${prefix}-${process.pid}-${n++}`;
const WAIT_MS = 5000;

before(async () => {
  gw = await startGateway(['--heartbeat-ms', '500'], { grpc: true });
  kubemq = kubemqClient(gw.grpcAddr);
});
after(async () => { kubemq?.close(); await gw?.stop(); });

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

/** Subscribes with a receipt as the barrier: once it resolves (with the subscription), the
 * subscription is in place. */
function subscribeConfirmed(client, destination, onMessage, headers = {}) {
  return new Promise((resolve, reject) => {
    const receipt = unique('sub');
    let sub;
    client.watchForReceipt(receipt, () => resolve(sub));
    sub = client.subscribe(destination, onMessage, { ...headers, receipt });
    setTimeout(() => reject(new Error('no RECEIPT for SUBSCRIBE within the wait')), WAIT_MS);
  });
}

/** A confirmed subscription that keeps every message: `next()` resolves with the next one in
 * arrival order, `all` is everything so far (to check that nothing else came). */
async function inbox(client, destination, headers = {}) {
  const all = [];
  const queued = [];
  const waiting = [];
  const sub = await subscribeConfirmed(client, destination, (m) => {
    all.push(m);
    if (waiting.length) waiting.shift()(m); else queued.push(m);
  }, headers);
  const next = () => new Promise((resolve, reject) => {
    if (queued.length) { resolve(queued.shift()); return; }
    waiting.push(resolve);
    setTimeout(() => reject(new Error(`no message on ${destination} within the wait`)), WAIT_MS);
  });
  return { sub, all, next };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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

test('events-store: messages stored before subscribing are replayed from the first in order; a default subscriber gets only new ones', async () => {
  const c = await connect();
  const dest = `/topic-store/${unique('js-store')}`;
  // Each SEND is receipted, so all three are stored before anyone subscribes.
  for (const body of ['one', 'two', 'three']) await publishConfirmed(c, { destination: dest, body });
  const replay = await inbox(c, dest, { 'x-kubemq-start': 'first' });
  const replayed = [await replay.next(), await replay.next(), await replay.next()];
  assert.deepEqual(replayed.map((m) => m.body), ['one', 'two', 'three']);
  assert.deepEqual(replayed.map((m) => m.headers['x-kubemq-sequence']), ['1', '2', '3']);
  assert.deepEqual(replayed.map((m) => m.headers.destination), [dest, dest, dest]);
  for (const m of replayed) assert.match(m.headers['x-kubemq-timestamp'], /^[1-9][0-9]*$/);
  // No x-kubemq-start: README's default is new-only, so this subscriber sees none of the three.
  const d = await connect();
  const later = await inbox(d, dest);
  await publishConfirmed(c, { destination: dest, body: 'four' });
  const fresh = await later.next();
  assert.equal(fresh.body, 'four');
  assert.equal(fresh.headers['x-kubemq-sequence'], '4');
  // The replaying subscriber goes on live after the stored ones, without a gap or a repeat.
  assert.equal((await replay.next()).body, 'four');
  // The receipt of 'four' came once both subscribers had it; a stray replay would have come
  // before it, and a short wait leaves room for anything late.
  await sleep(300);
  assert.deepEqual(later.all.map((m) => m.body), ['four']);
  assert.deepEqual(replay.all.map((m) => m.body), ['one', 'two', 'three', 'four']);
  await Promise.all([c.deactivate(), d.deactivate()]);
});

test('commands: a native gRPC responder answers a stompjs requester on its /reply/ subscription', async () => {
  const channel = unique('js-cmd');
  const svc = responder(kubemq, SUBSCRIBE_COMMANDS, channel, (request) => ({
    Body: Buffer.concat([Buffer.from('done: '), request.Body]), Executed: true, Tags: { 'x-answered-by': 'node-grpc' },
  }));
  const c = await connect();
  try {
    await svc.ready;
    const replies = await inbox(c, '/reply/x');
    c.publish({
      destination: `/command/${channel}`, body: 'run job 7',
      headers: { 'reply-to': '/reply/x', 'correlation-id': 'c-7', timeout: '5000', 'x-order': '7' },
    });
    const r = await replies.next();
    // What the responder got: the body, a command, the timeout in ms, the custom header as a tag
    // (and `timeout` is machinery, not a tag).
    assert.equal(svc.requests.length, 1);
    const req = svc.requests[0];
    assert.deepEqual(req.Body, Buffer.from('run job 7'));
    assert.equal(req.Channel, channel);
    assert.equal(req.RequestTypeData, 1);
    assert.equal(req.Timeout, 5000);
    assert.equal(req.Tags['x-order'], '7');
    assert.equal(req.Tags['stomp.correlation-id'], 'c-7', 'correlation-id travels as its reserved tag');
    assert.equal(req.Tags.timeout, undefined);
    // What the requester got back.
    assert.equal(r.headers.destination, '/reply/x');
    assert.equal(r.headers.subscription, replies.sub.id);
    assert.equal(r.headers['correlation-id'], 'c-7');
    assert.equal(r.headers['x-kubemq-executed'], 'true');
    assert.equal(r.headers['stomp-error'], undefined);
    assert.equal(r.headers['x-answered-by'], 'node-grpc');
    assert.equal(r.body, 'done: run job 7');
  } finally {
    svc.stop();
    await c.deactivate();
  }
});

test('commands: a responder\'s failure comes back as stomp-error:failed with its error text, the connection stays open', async () => {
  const channel = unique('js-cmd-fail');
  const svc = responder(kubemq, SUBSCRIBE_COMMANDS, channel, () => ({ Executed: false, Error: 'disk full', Tags: { 'x-why': 'quota' } }));
  const c = await connect();
  try {
    await svc.ready;
    const replies = await inbox(c, '/reply/x');
    c.publish({ destination: `/command/${channel}`, body: 'write', headers: { 'reply-to': '/reply/x', 'correlation-id': 'c-8', timeout: '5000' } });
    const r = await replies.next();
    assert.equal(r.headers['stomp-error'], 'failed');
    assert.equal(r.headers['x-kubemq-error'], 'disk full');
    assert.equal(r.headers['x-kubemq-executed'], 'false');
    assert.equal(r.headers['correlation-id'], 'c-8');
    assert.equal(r.headers['x-why'], 'quota', 'a failed reply keeps the responder\'s tags');
    // A reply failure is not an ERROR: the same connection still has its receipts answered.
    await publishConfirmed(c, { destination: `/topic/${unique('js-after')}`, body: 'still here' });
  } finally {
    svc.stop();
    await c.deactivate();
  }
});

test('queries: a native gRPC responder answers with a body and metadata', async () => {
  const channel = unique('js-query');
  const svc = responder(kubemq, SUBSCRIBE_QUERIES, channel, (request) => ({
    Body: Buffer.concat([request.Body, Buffer.from(' → 42')]), Metadata: 'answer-meta', Executed: true, Tags: { 'x-source': 'cache-miss' },
  }));
  const c = await connect();
  try {
    await svc.ready;
    const replies = await inbox(c, '/reply/x');
    c.publish({
      destination: `/query/${channel}`, body: 'price of item 9',
      headers: { 'reply-to': '/reply/x', 'correlation-id': 'q-9', timeout: '5000', 'x-currency': 'EUR' },
    });
    const r = await replies.next();
    assert.equal(svc.requests.length, 1);
    const req = svc.requests[0];
    assert.deepEqual(req.Body, Buffer.from('price of item 9'));
    assert.equal(req.RequestTypeData, 2);
    assert.equal(req.Timeout, 5000);
    assert.equal(req.Tags['x-currency'], 'EUR');
    assert.equal(r.headers.destination, '/reply/x');
    assert.equal(r.headers['correlation-id'], 'q-9');
    assert.equal(r.headers['stomp-error'], undefined);
    assert.equal(r.headers['x-kubemq-executed'], undefined, 'a query reply has no executed flag');
    assert.equal(r.headers['x-kubemq-metadata'], 'answer-meta');
    assert.equal(r.headers['x-source'], 'cache-miss');
    assert.equal(r.body, 'price of item 9 → 42');
    assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.body)));
  } finally {
    svc.stop();
    await c.deactivate();
  }
});

test('an RPC with no responder gets stomp-error:no-responder at once, well within its timeout', async () => {
  const c = await connect();
  try {
    const replies = await inbox(c, '/reply/x');
    const sentAt = Date.now();
    c.publish({
      destination: `/command/${unique('js-nobody')}`, body: 'anyone?',
      headers: { 'reply-to': '/reply/x', 'correlation-id': 'n-1', timeout: '3000' },
    });
    const r = await replies.next();
    const took = Date.now() - sentAt;
    assert.equal(r.headers['stomp-error'], 'no-responder');
    assert.equal(r.headers['correlation-id'], 'n-1');
    assert.equal(r.headers['x-kubemq-executed'], undefined);
    assert.equal(r.headers['content-length'], '0');
    assert.equal(r.body, '');
    // README: no responder is answered at once, not after the 3 s timeout.
    assert.ok(took < 1000, `no-responder came after ${took} ms`);
    // The connection stays open and usable.
    await publishConfirmed(c, { destination: `/topic/${unique('js-after')}`, body: 'still here' });
  } finally {
    await c.deactivate();
  }
});

test('an RPC whose responder never answers gets stomp-error:timeout once its timeout has passed', async () => {
  const channel = unique('js-silent');
  const svc = responder(kubemq, SUBSCRIBE_QUERIES, channel, () => null);
  const c = await connect();
  try {
    await svc.ready;
    const replies = await inbox(c, '/reply/x');
    const sentAt = Date.now();
    c.publish({ destination: `/query/${channel}`, body: 'hello?', headers: { 'reply-to': '/reply/x', 'correlation-id': 't-1', timeout: '1000' } });
    const r = await replies.next();
    const took = Date.now() - sentAt;
    assert.equal(svc.requests.length, 1, 'the responder got the request (so this is not no-responder)');
    assert.equal(r.headers['stomp-error'], 'timeout');
    assert.equal(r.headers['correlation-id'], 't-1');
    assert.equal(r.headers['content-length'], '0');
    assert.equal(r.body, '');
    // The gateway's clock starts when it reads the SEND, after `sentAt`; its 100 ms tick can make
    // the reply late, not early (50 ms allowed for the two clocks' granularity).
    assert.ok(took >= 950, `timeout came after ${took} ms, before the 1000 ms timeout`);
    assert.ok(took < 3000, `timeout came after ${took} ms`);
    await publishConfirmed(c, { destination: `/topic/${unique('js-after')}`, body: 'still here' });
  } finally {
    svc.stop();
    await c.deactivate();
  }
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
