// The official KubeMQ Node SDK, kubemq-js (pinned in package.json), against a real stompgate's
// KubeMQ gRPC API on the embedded array, with a raw STOMP 1.2 client over TCP on the same
// channels: every pattern in both directions (issue 18). kubemq-js's own quirks, which these
// tests pin down too, are listed in README's "kubemq-js (Node)" section.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import kubemq from 'kubemq-js';
import { startGateway } from './gateway.mjs';
import { StompTcp } from './stomp-tcp.mjs';

const { EventsClient, EventsStoreClient, EventStoreType, QueuesClient, CommandsClient, QueriesClient } = kubemq;
const WAIT_MS = 5000;

let gw;
let n = 0;
const unique = (prefix) => `${prefix}-${process.pid}-${n++}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const bytes = (body) => Buffer.from(body);
/** A kubemq-js tags map (google-protobuf's jspb.Map) as a plain object. */
const tagsOf = (m) => Object.fromEntries(m.tags.entries());
/** Bytes no text codec would pass unchanged: NULs, a lone newline, invalid UTF-8. */
const BINARY = Buffer.from([0x00, 0x01, 0x0a, 0x00, 0xff, 0xfe, 0x80, 0x7f, 0x3a, 0x5c]);

before(async () => { gw = await startGateway([], { grpc: true }); });
after(async () => { await gw?.stop(); });

/** A kubemq-js client of class `Kind`; reconnectInterval 0 lets a subscription end for good. */
const sdk = (Kind, clientId = unique('js')) => new Kind({ address: gw.grpcAddr, clientId, reconnectInterval: 0 });

/** What a kubemq-js callback `(err, item)` delivered, to wait on. */
class Inbox {
  constructor() {
    this.items = [];
    this.errors = [];
    this.waiters = new Set();
    this.push = (err, item) => {
      if (err) this.errors.push(err);
      else if (item) this.items.push(item);
      for (const w of [...this.waiters]) w();
    };
  }

  /** Waits until `ready()` returns a value (not undefined), or fails after `ms`. */
  until(ready, what, ms = WAIT_MS) {
    return new Promise((resolve, reject) => {
      const check = () => {
        const v = ready();
        if (v !== undefined) { done(); resolve(v); }
      };
      const timer = setTimeout(() => { done(); reject(new Error(`no ${what} within ${ms} ms (errors: ${this.errors.map((e) => e.message)})`)); }, ms);
      const done = () => { clearTimeout(timer); this.waiters.delete(check); };
      this.waiters.add(check);
      check();
    });
  }

  /** The first item that `match` accepts, taken out of the inbox. */
  take(match = () => true, ms = WAIT_MS) {
    return this.until(() => {
      const i = this.items.findIndex(match);
      return i >= 0 ? this.items.splice(i, 1)[0] : undefined;
    }, 'matching item', ms);
  }

  /** The first `count` items that `match` accepts, once that many came. */
  takeN(count, match = () => true, ms = WAIT_MS) {
    return this.until(() => {
      const hits = this.items.filter(match);
      if (hits.length < count) return undefined;
      this.items = this.items.filter((m) => !hits.slice(0, count).includes(m));
      return hits.slice(0, count);
    }, `${count} items`, ms);
  }

  nextError(ms = WAIT_MS) {
    return this.until(() => this.errors.shift(), 'error', ms);
  }
}

/** A kubemq-js subscription (`client.subscribe(request, cb)`) collected into an Inbox. */
async function subscribed(client, request) {
  const inbox = new Inbox();
  const handle = await client.subscribe(request, inbox.push);
  return { inbox, stop: () => { handle.unsubscribe(); client.close(); } };
}

const isProbe = (m) => bytes(m.body).toString().startsWith('probe-');

/** Barrier for a kubemq-js Events subscription: kubemq-js reports no "subscribed", so probe
 * events are sent until one arrives; SendEvent answers once live subscribers took the event, so
 * no probe arrives after the one that was seen. */
async function eventsReady(inbox, channel) {
  const pub = sdk(EventsClient);
  const deadline = Date.now() + WAIT_MS;
  try {
    for (let i = 0; ; i++) {
      await pub.send({ channel, body: bytes(`probe-${i}`) });
      const seen = await inbox.take(isProbe, 100).catch(() => null);
      if (seen) break;
      if (Date.now() > deadline) throw new Error(`kubemq-js subscription on ${channel} never got a probe`);
    }
    inbox.items = inbox.items.filter((m) => !isProbe(m));
  } finally {
    pub.close();
  }
}

/** A kubemq-js Commands or Queries responder on `channel`; `answer(request)` gives the fields
 * of its response. */
async function responder(Kind, channel, answer) {
  const client = sdk(Kind, unique('responder'));
  const inbox = new Inbox();
  const handle = await client.subscribe({ channel }, (err, req) => {
    inbox.push(err, req);
    if (req) client.response({ id: req.id, replyChannel: req.replyChannel, executed: true, error: '', ...answer(req) }).catch((e) => inbox.errors.push(e));
  });
  return { client, inbox, stop: () => { handle.unsubscribe(); client.close(); } };
}

/** Barrier for a responder, from the STOMP side: probe requests until one is not answered
 * `stomp-error:no-responder`. The responder answers the probes too (body `probe-N`). */
async function stompSeesResponder(s, kind, channel, replyTo) {
  const deadline = Date.now() + WAIT_MS;
  for (let i = 0; ; i++) {
    const correlation = unique('probe');
    s.write('SEND', { destination: `/${kind}/${channel}`, 'reply-to': replyTo, 'correlation-id': correlation }, `probe-${i}`);
    const reply = await s.next((f) => f.command === 'MESSAGE' && f.headers['correlation-id'] === correlation);
    if (reply.headers['stomp-error'] !== 'no-responder') return;
    if (Date.now() > deadline) throw new Error(`no ${kind} responder on ${channel} within the wait`);
    await sleep(100);
  }
}

/** Barrier for a responder, from the kubemq-js side: a sender's NOT_FOUND means none yet. */
async function sdkSeesResponder(sender, channel) {
  const deadline = Date.now() + WAIT_MS;
  for (let i = 0; ; i++) {
    try {
      await sender.send({ channel, body: bytes(`probe-${i}`), timeout: 2000 });
      return;
    } catch (e) {
      if (e.code !== 5 || Date.now() > deadline) throw e;
      await sleep(100);
    }
  }
}

// ----- Events -------------------------------------------------------------------------------

test('Events: a kubemq-js publisher reaches a STOMP subscriber byte-exact, Metadata as x-kubemq-metadata', async () => {
  const s = await StompTcp.connect(gw.stompPort);
  const channel = unique('js-ev');
  await s.subscribe('ev', `/topic/${channel}`);
  const pub = sdk(EventsClient);
  const id = unique('event-id');
  const result = await pub.send({ id, channel, body: BINARY, metadata: 'meta-1' });
  assert.deepEqual(result, { id, sent: true });
  const m = await s.message('ev');
  assert.deepEqual(m.body, BINARY);
  assert.equal(m.headers.destination, `/topic/${channel}`);
  assert.equal(m.headers['x-kubemq-metadata'], 'meta-1');
  assert.equal(m.headers['content-length'], String(BINARY.length));
  assert.equal(m.headers['content-type'], undefined, 'no content-type is invented for a native producer');
  pub.close();
  s.close();
});

test('Events: kubemq-js sends a string body as base64, and cannot send a tag with a value', async () => {
  const s = await StompTcp.connect(gw.stompPort);
  const channel = unique('js-ev-quirks');
  await s.subscribe('ev', `/topic/${channel}`);
  const pub = sdk(EventsClient);
  // google-protobuf takes a string for a bytes field as base64: 'aGVsbG8gc3RvbXA=' is 'hello stomp'.
  await pub.send({ channel, body: 'aGVsbG8gc3RvbXA=' });
  const decoded = await s.message('ev');
  assert.equal(decoded.body.toString(), 'hello stomp');
  // kubemq-js calls the protobuf map's set(tags) with one argument: a Map (or an object) is
  // refused by its serializer before anything is sent; a string becomes one tag with no value.
  await assert.rejects(pub.send({ channel, body: bytes('never sent'), tags: new Map([['region', 'eu']]) }),
    (e) => e.code === 13 && /serialization failure/.test(e.message));
  await pub.send({ channel, body: bytes('flagged'), tags: 'flag' });
  const flagged = await s.message('ev');
  assert.equal(flagged.body.toString(), 'flagged', 'the refused send delivered nothing');
  assert.equal(flagged.headers.flag, '');
  pub.close();
  s.close();
});

test('Events: a STOMP SEND reaches a kubemq-js subscriber byte-exact, with its headers as tags', async () => {
  const channel = unique('js-ev-in');
  const sub = await subscribed(sdk(EventsClient), { channel });
  await eventsReady(sub.inbox, channel);
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/topic/${channel}`, region: 'eu', 'content-type': 'application/octet-stream', 'correlation-id': 'c-7' }, BINARY);
  const m = await sub.inbox.take();
  assert.deepEqual(bytes(m.body), BINARY);
  assert.equal(m.channel, channel);
  assert.equal(m.metadata, '');
  assert.deepEqual(tagsOf(m), { region: 'eu', 'stomp.content-type': 'application/octet-stream', 'stomp.correlation-id': 'c-7' });
  assert.deepEqual(sub.inbox.errors, []);
  sub.stop();
  s.close();
});

test('Events: a STOMP header with an empty value reaches a kubemq-js subscriber as an empty tag', async () => {
  const channel = unique('js-ev-empty');
  const sub = await subscribed(sdk(EventsClient), { channel });
  await eventsReady(sub.inbox, channel);
  const s = await StompTcp.connect(gw.stompPort);
  try {
    await s.receipted('SEND', { destination: `/topic/${channel}`, empty: '' }, 'with an empty header');
    const m = await sub.inbox.take(() => true, 2000);
    assert.deepEqual(tagsOf(m), { empty: '' });
    assert.deepEqual(sub.inbox.errors, []);
  } finally {
    sub.stop();
    s.close();
  }
});

// ----- Events-Store -------------------------------------------------------------------------

test('Events-Store: kubemq-js and STOMP store into one channel and both replay it from the first', async () => {
  const channel = unique('js-store');
  const store = sdk(EventsStoreClient);
  const s = await StompTcp.connect(gw.stompPort);
  const first = await store.send({ id: 'store-1', channel, body: bytes('one'), metadata: 'm1' });
  assert.deepEqual(first, { id: 'store-1', sent: true, error: '' });
  await s.receipted('SEND', { destination: `/topic-store/${channel}`, kind: 'stomp' }, 'two');
  assert.deepEqual(await store.send({ id: 'store-3', channel, body: BINARY }), { id: 'store-3', sent: true, error: '' });

  await s.subscribe('replay', `/topic-store/${channel}`, { 'x-kubemq-start': 'first' });
  const replayed = [await s.message('replay'), await s.message('replay'), await s.message('replay')];
  assert.deepEqual(replayed.map((f) => f.body), [bytes('one'), bytes('two'), BINARY]);
  assert.deepEqual(replayed.map((f) => f.headers['x-kubemq-sequence']), ['1', '2', '3']);
  assert.equal(replayed[0].headers['x-kubemq-metadata'], 'm1');
  assert.equal(replayed[1].headers.kind, 'stomp');
  assert.ok(replayed.every((f) => /^[1-9][0-9]*$/.test(f.headers['x-kubemq-timestamp'])), 'nanosecond timestamps');

  const sub = await subscribed(sdk(EventsStoreClient), { channel, requestType: EventStoreType.StartFromFirst });
  const got = await sub.inbox.takeN(3);
  assert.deepEqual(got.map((m) => bytes(m.body)), [bytes('one'), bytes('two'), BINARY]);
  assert.deepEqual(got.map((m) => m.sequence), [1, 2, 3]);
  assert.deepEqual(got.map((m) => m.metadata), ['m1', '', '']);
  assert.deepEqual(tagsOf(got[1]), { kind: 'stomp' });
  assert.deepEqual(got.map((m) => m.channel), [channel, channel, channel]);
  sub.stop();
  store.close();
  s.close();
});

test('Events-Store: a kubemq-js subscription from a sequence gets that one and the later ones, as STOMP does', async () => {
  const channel = unique('js-store-seq');
  const s = await StompTcp.connect(gw.stompPort);
  for (const body of ['s1', 's2', 's3', 's4']) await s.receipted('SEND', { destination: `/topic-store/${channel}` }, body);
  const sub = await subscribed(sdk(EventsStoreClient), { channel, requestType: EventStoreType.StartAtSequence, requestTypeValue: 3 });
  const got = await sub.inbox.takeN(2);
  assert.deepEqual(got.map((m) => [bytes(m.body).toString(), m.sequence]), [['s3', 3], ['s4', 4]]);
  await s.subscribe('seq', `/topic-store/${channel}`, { 'x-kubemq-start': 'sequence:3' });
  const fromStomp = [await s.message('seq'), await s.message('seq')];
  assert.deepEqual(fromStomp.map((f) => [f.body.toString(), f.headers['x-kubemq-sequence']]), [['s3', '3'], ['s4', '4']]);
  // Nothing older came afterwards: a new event is the next one either side sees.
  await s.receipted('SEND', { destination: `/topic-store/${channel}` }, 's5');
  assert.equal(bytes((await sub.inbox.take()).body).toString(), 's5');
  assert.equal((await s.message('seq')).body.toString(), 's5');
  assert.deepEqual(sub.inbox.items, []);
  sub.stop();
  s.close();
});

// ----- Queues -------------------------------------------------------------------------------

test('Queues: a kubemq-js send reaches a STOMP consumer, and its ACK empties the queue', async () => {
  const channel = unique('js-q');
  const q = sdk(QueuesClient);
  const sent = await q.send({ id: 'q-msg-1', channel, body: BINARY, metadata: 'qm' });
  assert.equal(sent.id, 'q-msg-1');
  assert.equal(sent.isError, false);
  assert.equal(sent.error, '');
  assert.ok(sent.sentAt > 0, 'sentAt is set');
  const s = await StompTcp.connect(gw.stompPort);
  await s.subscribe('q', `/queue/${channel}`, { ack: 'client-individual' });
  const m = await s.message('q');
  assert.deepEqual(m.body, BINARY);
  assert.equal(m.headers.destination, `/queue/${channel}`);
  assert.equal(m.headers['x-kubemq-metadata'], 'qm');
  await s.receipted('ACK', { id: m.headers.ack });
  const left = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(left.messages.length, 0);
  q.close();
  s.close();
});

test('Queues: STOMP SENDs reach kubemq-js peek and pull in order, with their headers as tags', async () => {
  const channel = unique('js-q-pull');
  const s = await StompTcp.connect(gw.stompPort);
  for (const [i, body] of [['1', 'a'], ['2', BINARY], ['3', 'c']]) await s.receipted('SEND', { destination: `/queue/${channel}`, job: i }, body);
  const q = sdk(QueuesClient);
  const peeked = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(peeked.isError, false, peeked.error);
  assert.equal(peeked.isPeek, true);
  assert.deepEqual(peeked.messages.map((m) => bytes(m.body)), [bytes('a'), BINARY, bytes('c')]);
  const pulled = await q.pull({ channel, maxNumberOfMessages: 2, waitTimeoutSeconds: 1 });
  assert.equal(pulled.isError, false, pulled.error);
  assert.equal(pulled.messagesReceived, 2);
  assert.deepEqual(pulled.messages.map((m) => bytes(m.body)), [bytes('a'), BINARY]);
  assert.deepEqual(pulled.messages.map(tagsOf), [{ job: '1' }, { job: '2' }]);
  assert.deepEqual(pulled.messages.map((m) => m.attributes.sequence), [1, 2]);
  assert.deepEqual(pulled.messages.map((m) => m.attributes.receiveCount), [1, 1]);
  assert.deepEqual(pulled.messages.map((m) => m.channel), [channel, channel]);
  const rest = await q.pull({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.deepEqual(rest.messages.map((m) => [bytes(m.body).toString(), tagsOf(m)]), [['c', { job: '3' }]]);
  const none = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(none.messages.length, 0, 'pull removed all three');
  q.close();
  s.close();
});

test('Queues: a STOMP message with an empty-valued header reaches kubemq-js pull as an empty tag', async () => {
  const channel = unique('js-q-empty');
  const s = await StompTcp.connect(gw.stompPort);
  const q = sdk(QueuesClient);
  try {
    await s.receipted('SEND', { destination: `/queue/${channel}`, empty: '' }, 'with an empty header');
    const pulled = await q.pull({ channel, maxNumberOfMessages: 1, waitTimeoutSeconds: 1 });
    assert.deepEqual(pulled.messages.map((m) => [bytes(m.body).toString(), tagsOf(m)]), [['with an empty header', { empty: '' }]]);
  } finally {
    q.close();
    s.close();
  }
});

/** Starts a kubemq-js `transaction()` (StreamQueueMessage); `ended` settles when the stream ends. */
function transaction(q, request) {
  const inbox = new Inbox();
  const ended = q.transaction({ visibilitySeconds: 30, waitTimeoutSeconds: 2, ...request }, inbox.push);
  ended.catch(() => {});
  return { inbox, ended };
}

test('Queues: kubemq-js transaction() receives a STOMP message, and its ack ends the stream and removes it', async () => {
  const channel = unique('js-tx');
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/queue/${channel}`, job: '7' }, BINARY);
  const q = sdk(QueuesClient);
  const tx = transaction(q, { channel });
  const t = await tx.inbox.take();
  assert.deepEqual(bytes(t.message.body), BINARY);
  assert.deepEqual(tagsOf(t.message), { job: '7' });
  assert.equal(t.message.channel, channel);
  assert.equal(t.message.attributes.sequence, 1);
  assert.equal(t.message.attributes.receiveCount, 1);
  await t.ack();
  await tx.ended; // the server ends the stream after the ack
  assert.deepEqual(tx.inbox.errors, []);
  // The acknowledged message is gone: a STOMP consumer and another transaction find nothing.
  const empty = transaction(q, { channel, waitTimeoutSeconds: 1 });
  assert.match((await empty.inbox.nextError(4000)).message, /^Error 138: /);
  await s.subscribe('q', `/queue/${channel}`);
  await s.receipted('SEND', { destination: `/queue/${channel}` }, 'after the ack');
  assert.equal((await s.message('q')).body.toString(), 'after the ack', 'the acked message was not delivered again');
  q.close();
  s.close();
});

test('Queues: a message rejected in a kubemq-js transaction is redelivered to STOMP and counted', async () => {
  const channel = unique('js-tx-reject');
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/queue/${channel}` }, 'reject me');
  const q = sdk(QueuesClient);
  const tx = transaction(q, { channel });
  const t = await tx.inbox.take();
  assert.equal(bytes(t.message.body).toString(), 'reject me');
  await t.reject();
  await tx.ended;
  // Back in the queue: a second transaction sees its second receive, rejects it again, and a
  // STOMP consumer then gets it marked as a redelivery.
  const again = transaction(q, { channel });
  const t2 = await again.inbox.take();
  assert.equal(bytes(t2.message.body).toString(), 'reject me');
  assert.equal(t2.message.attributes.receiveCount, 2);
  assert.equal(t2.message.attributes.sequence, t.message.attributes.sequence);
  await t2.reject();
  await again.ended;
  await s.subscribe('q', `/queue/${channel}`, { ack: 'client-individual' });
  const m = await s.message('q');
  assert.equal(m.body.toString(), 'reject me');
  assert.equal(m.headers.redelivered, 'true');
  await s.receipted('ACK', { id: m.headers.ack });
  q.close();
  s.close();
});

test('Queues: extendVisibility keeps a kubemq-js transaction message hidden past its first visibility', async () => {
  const channel = unique('js-tx-extend');
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/queue/${channel}` }, 'slow work');
  const q = sdk(QueuesClient);
  const tx = transaction(q, { channel, visibilitySeconds: 1 });
  const t = await tx.inbox.take();
  await t.extendVisibility(10);
  await sleep(2000); // twice the first visibility: without the extension it would be back
  assert.deepEqual(tx.inbox.errors, [], 'no "visibility timer expired"');
  const peeked = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(peeked.messages.length, 0, 'the message is still held by the transaction');
  await t.ack();
  await tx.ended;
  const after = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(after.messages.length, 0, 'acknowledged, not returned');
  q.close();
  s.close();
});

test('Queues: a kubemq-js transaction message whose visibility runs out goes back to the queue', async () => {
  const channel = unique('js-tx-expire');
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/queue/${channel}` }, 'forgotten');
  const q = sdk(QueuesClient);
  const tx = transaction(q, { channel, visibilitySeconds: 1 });
  const t = await tx.inbox.take();
  assert.equal(bytes(t.message.body).toString(), 'forgotten');
  const expired = await tx.inbox.nextError(4000);
  assert.match(expired.message, /^Error 129: /);
  await tx.ended;
  const back = await q.pull({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.deepEqual(back.messages.map((m) => [bytes(m.body).toString(), m.attributes.receiveCount]), [['forgotten', 2]]);
  q.close();
  s.close();
});

test('Queues: a kubemq-js transaction resends its message to another queue, or replaces it, and ends', async () => {
  const [channel, other] = [unique('js-tx-resend'), unique('js-tx-other')];
  const s = await StompTcp.connect(gw.stompPort);
  await s.receipted('SEND', { destination: `/queue/${channel}`, job: '1' }, 'move me');
  await s.receipted('SEND', { destination: `/queue/${channel}` }, 'replace me');
  const q = sdk(QueuesClient);
  const moving = transaction(q, { channel });
  const t = await moving.inbox.take();
  assert.equal(bytes(t.message.body).toString(), 'move me');
  await t.resendToChannel(other);
  await moving.ended;
  const replacing = transaction(q, { channel });
  const t2 = await replacing.inbox.take();
  assert.equal(bytes(t2.message.body).toString(), 'replace me');
  await t2.resendNewMessage({ channel: other, body: BINARY, metadata: 'new' });
  await replacing.ended;
  assert.deepEqual([...moving.inbox.errors, ...replacing.inbox.errors], []);
  // The other queue holds the moved message (tags kept) and then the new one; the first is empty.
  await s.subscribe('other', `/queue/${other}`);
  const [moved, replaced] = [await s.message('other'), await s.message('other')];
  assert.deepEqual([moved.body.toString(), moved.headers.job], ['move me', '1']);
  assert.deepEqual([replaced.body, replaced.headers['x-kubemq-metadata']], [BINARY, 'new']);
  const left = await q.peek({ channel, maxNumberOfMessages: 10, waitTimeoutSeconds: 1 });
  assert.equal(left.messages.length, 0, 'both left the first queue');
  q.close();
  s.close();
});

// ----- Commands and Queries -----------------------------------------------------------------

test('Commands: a kubemq-js responder answers a STOMP requester on its /reply/ subscription', async () => {
  const channel = unique('js-cmd');
  const r = await responder(CommandsClient, channel, (req) => (bytes(req.body).toString() === 'fail' ? { executed: false, error: 'disk full' } : {}));
  const s = await StompTcp.connect(gw.stompPort);
  await s.subscribe('reply', '/reply/cmd');
  await stompSeesResponder(s, 'command', channel, '/reply/cmd');
  s.write('SEND', { destination: `/command/${channel}`, 'reply-to': '/reply/cmd', 'correlation-id': 'c-1', k: 'v' }, BINARY);
  const ok = await s.message('reply');
  assert.equal(ok.headers['correlation-id'], 'c-1');
  assert.equal(ok.headers['x-kubemq-executed'], 'true');
  assert.equal(ok.headers['stomp-error'], undefined);
  assert.equal(ok.body.length, 0, 'a kubemq-js command response has no body');
  const [seen] = r.inbox.items.filter((m) => !isProbe(m));
  assert.deepEqual(bytes(seen.body), BINARY);
  assert.equal(seen.channel, channel);
  assert.equal(seen.metadata, '');
  assert.deepEqual(tagsOf(seen), { k: 'v', 'stomp.correlation-id': 'c-1', 'stomp.reply-to': '/reply/cmd' });

  s.write('SEND', { destination: `/command/${channel}`, 'reply-to': '/reply/cmd', 'correlation-id': 'c-2' }, 'fail');
  const failed = await s.message('reply');
  assert.equal(failed.headers['correlation-id'], 'c-2');
  assert.equal(failed.headers['stomp-error'], 'failed');
  assert.equal(failed.headers['x-kubemq-error'], 'disk full');
  assert.equal(failed.headers['x-kubemq-executed'], 'false');
  assert.deepEqual(r.inbox.errors, []);
  r.stop();
  s.close();
});

test('Queries: a kubemq-js responder answers a STOMP requester with its body and metadata', async () => {
  const channel = unique('js-query');
  const r = await responder(QueriesClient, channel, (req) => ({ body: Buffer.concat([bytes('re:'), bytes(req.body)]), metadata: 'answer-md' }));
  const s = await StompTcp.connect(gw.stompPort);
  await s.subscribe('reply', '/reply/q');
  await stompSeesResponder(s, 'query', channel, '/reply/q');
  s.write('SEND', { destination: `/query/${channel}`, 'reply-to': '/reply/q', 'correlation-id': 'q-1', region: 'eu' }, BINARY);
  const m = await s.message('reply');
  assert.equal(m.headers['correlation-id'], 'q-1');
  assert.equal(m.headers['stomp-error'], undefined);
  assert.deepEqual(m.body, Buffer.concat([bytes('re:'), BINARY]));
  assert.equal(m.headers['x-kubemq-metadata'], 'answer-md');
  const [seen] = r.inbox.items.filter((q) => !isProbe(q));
  assert.deepEqual(bytes(seen.body), BINARY);
  assert.deepEqual(tagsOf(seen), { region: 'eu', 'stomp.correlation-id': 'q-1', 'stomp.reply-to': '/reply/q' });
  r.stop();
  s.close();
});

test('Commands and Queries: STOMP cannot be the responder, so a kubemq-js sender finds none', async () => {
  // STOMP is requester-only (the seed's RPC flow): SUBSCRIBE to /command/ or /query/ is refused.
  const channel = unique('js-no-responder');
  for (const kind of ['command', 'query']) {
    const s = await StompTcp.connect(gw.stompPort);
    s.write('SUBSCRIBE', { id: 'x', destination: `/${kind}/${channel}` });
    const err = await s.next((f) => f.command === 'ERROR');
    assert.equal(err.headers.message, 'cannot subscribe to RPC destinations');
    await s.next(() => false, WAIT_MS).catch((e) => assert.match(e.message, /connection closed/));
    assert.ok(s.closed, 'the gateway closes the connection after the ERROR');
  }
  const [commands, queries] = [sdk(CommandsClient), sdk(QueriesClient)];
  const started = Date.now();
  await assert.rejects(commands.send({ channel, body: bytes('anyone?'), timeout: 3000 }),
    (e) => e.code === 5 && /no responder/.test(e.message));
  await assert.rejects(queries.send({ channel, body: bytes('anyone?'), timeout: 3000 }),
    (e) => e.code === 5 && /no responder/.test(e.message));
  assert.ok(Date.now() - started < 3000, 'NOT_FOUND comes at once, not after the request timeout');
  commands.close();
  queries.close();
});

test('Commands and Queries: a kubemq-js sender is answered by a kubemq-js responder through the gateway', async () => {
  const channel = unique('js-rpc');
  const cmd = await responder(CommandsClient, channel, () => ({}));
  const sender = sdk(CommandsClient, 'cmd-sender');
  await sdkSeesResponder(sender, channel);
  const done = await sender.send({ id: 'cmd-1', channel, body: BINARY, metadata: 'cm', timeout: 3000 });
  assert.equal(done.id, 'cmd-1');
  assert.equal(done.executed, true);
  assert.equal(done.error, '');
  assert.equal(done.clientId, cmd.client.clientOptions.clientId);
  const seenCmd = await cmd.inbox.take((m) => m.id === 'cmd-1');
  assert.deepEqual([bytes(seenCmd.body), seenCmd.metadata, seenCmd.channel], [BINARY, 'cm', channel]);

  const query = await responder(QueriesClient, channel, (req) => ({ body: Buffer.concat([bytes(req.body), bytes('!')]), metadata: 'qm' }));
  const asker = sdk(QueriesClient, 'query-sender');
  await sdkSeesResponder(asker, channel);
  const answer = await asker.send({ id: 'query-1', channel, body: BINARY, timeout: 3000 });
  assert.equal(answer.id, 'query-1');
  assert.equal(answer.executed, true);
  assert.deepEqual(bytes(answer.body), Buffer.concat([BINARY, bytes('!')]));
  assert.equal(answer.metadata, 'qm');
  assert.equal(answer.clientId, query.client.clientOptions.clientId);
  for (const c of [cmd, query]) c.stop();
  sender.close();
  asker.close();
});
