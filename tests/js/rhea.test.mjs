// The rhea AMQP 1.0 client (pinned in package.json) against a real stompgate's AMQP listener on
// the embedded array: seed 002's address master table and quick examples from a second client
// (the first is python-qpid-proton in tests/interop/test_amqp*.py), credit and drain, the four
// settlement outcomes, a multi-frame message, Events-Store start positions and a durable
// re-attach, a selector, RPC between two rhea links through responses/, and AMQP <-> STOMP on
// one channel, queue redelivery headers, a credit-following queue prefetch and a dynamic target.
// A test marked `todo` would assert the seed where the gateway does otherwise (none today).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import rhea from 'rhea';
import { startGateway } from './gateway.mjs';
import { StompTcp } from './stomp-tcp.mjs';

const HOST = '127.0.0.1';
const WAIT_MS = 5000;
const DYNAMIC = /^_amqp10\.tmp\.\d+\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

let n = 0;
const unique = (prefix) => `${prefix}-${process.pid}-${n++}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const { data_section: data } = rhea.message;

// ------------------------------------------------------------------------------------------------
// the gateway
// ------------------------------------------------------------------------------------------------

/** stompgate with STOMP and AMQP 1.0 on free loopback ports (and STOMP over WebSocket, unused). */
function startAmqpGateway(extraArgs = []) {
  return startGateway(extraArgs, { amqp: true });
}

let gw; // the default gateway (DefaultPattern queues)
let gwEvents; // DefaultPattern events
const open = new Set(); // every rhea connection, closed after each test

before(async () => { [gw, gwEvents] = await Promise.all([startAmqpGateway(), startAmqpGateway(['--amqp-default-pattern', 'events'])]); });
after(async () => { await Promise.all([gw?.stop(), gwEvents?.stop()]); });

// ------------------------------------------------------------------------------------------------
// promise-shaped rhea
// ------------------------------------------------------------------------------------------------

/** A refused attach or a failed wait: carries the AMQP condition when there is one. */
class AmqpError extends Error {
  constructor(what, error) {
    super(`${what}: ${error?.condition ?? 'no error'} ${error?.description ?? ''}`);
    this.condition = error?.condition;
    this.description = error?.description;
  }
}

/** Opens a connection (container-id `id`) and resolves once the gateway's OPEN arrived. */
function connect({ id = unique('rhea'), port = gw.amqpPort, ...opts } = {}) {
  const container = rhea.create_container({ id });
  container.on('error', () => {});
  const conn = container.connect({ host: HOST, port, reconnect: false, idle_time_out: 0, ...opts });
  conn.on('disconnected', () => {});
  conn.on('connection_error', () => {});
  open.add(conn);
  return new Promise((resolve, reject) => {
    conn.once('connection_open', () => resolve(conn));
    conn.once('connection_close', () => reject(new AmqpError('connection closed', conn.error)));
    conn.once('disconnected', (ctx) => reject(new Error(`disconnected: ${ctx.error?.message}`)));
  });
}

async function closeAll() {
  const conns = [...open];
  open.clear();
  await Promise.all(conns.map((c) => new Promise((resolve) => {
    if (!c.is_open()) { resolve(); return; }
    const t = setTimeout(resolve, 1000);
    c.once('connection_close', () => { clearTimeout(t); resolve(); });
    c.once('disconnected', () => { clearTimeout(t); resolve(); });
    c.close();
  })));
}

/** A body as bytes, whatever section rhea decoded it from. */
function bodyOf(m) {
  const b = m.body;
  if (Buffer.isBuffer(b)) return b;
  if (b && Buffer.isBuffer(b.content)) return b.content;
  if (typeof b === 'string') return Buffer.from(b);
  throw new Error(`unexpected body ${JSON.stringify(b)}`);
}
const text = (m) => bodyOf(m).toString('utf8');

/** A receiving link with an inbox of `{ message, delivery }`. */
class Rx {
  constructor(link) {
    this.link = link;
    this.inbox = [];
    this.waiters = new Set();
    this.drained = 0;
    link.on('message', (ctx) => { this.inbox.push({ message: ctx.message, delivery: ctx.delivery }); this.wake(); });
    link.on('receiver_drained', () => { this.drained += 1; this.wake(); });
    link.on('receiver_close', () => this.wake());
  }

  wake() { for (const w of [...this.waiters]) w(); }

  until(ready, what, ms = WAIT_MS) {
    return new Promise((resolve, reject) => {
      const check = () => {
        const v = ready();
        if (v !== undefined) { done(); resolve(v); }
      };
      const timer = setTimeout(() => { done(); reject(new Error(`no ${what} within ${ms} ms`)); }, ms);
      const done = () => { clearTimeout(timer); this.waiters.delete(check); };
      this.waiters.add(check);
      check();
    });
  }

  /** The next delivery, taken out of the inbox. */
  next(ms = WAIT_MS) { return this.until(() => this.inbox.shift(), `message on ${this.address}`, ms); }

  /** The next `count` deliveries. */
  async take(count, ms = WAIT_MS) {
    const got = [];
    while (got.length < count) got.push(await this.next(ms));
    return got;
  }

  /** Everything that arrives until the link has been quiet for `ms`. */
  async quiet(ms = 400) {
    const got = [];
    for (;;) {
      try { got.push(await this.next(ms)); } catch { return got; }
    }
  }

  get address() { return this.link.remote.attach?.source?.address; }
}

/** A sending link whose `send` resolves with the delivery's outcome. */
class Tx {
  constructor(link) {
    this.link = link;
    for (const state of ['accepted', 'rejected', 'released', 'modified']) {
      link.on(state, (ctx) => {
        const d = ctx.delivery;
        d.outcome?.({ state, condition: d.remote_state?.error?.condition, description: d.remote_state?.error?.description, remote: d.remote_state });
      });
    }
  }

  /** Sends `msg` (unsettled unless the link is pre-settled) and resolves with `{ state, condition }`. */
  send(msg, ms = WAIT_MS) {
    return new Promise((resolve, reject) => {
      const d = this.link.send(msg);
      if (this.link.local.attach.snd_settle_mode === 1) { resolve({ state: 'settled' }); return; }
      const timer = setTimeout(() => reject(new Error(`no outcome within ${ms} ms for a message to ${msg.to ?? this.link.remote.attach?.target?.address}`)), ms);
      d.outcome = (o) => { clearTimeout(timer); resolve(o); };
    });
  }

  /** Sends and asserts the delivery was accepted. */
  async ok(msg) {
    const o = await this.send(msg);
    assert.equal(o.state, 'accepted', `outcome ${JSON.stringify(o)}`);
  }
}

/** Opens a link (`receiver` or `sender`) and resolves with its Rx/Tx once attached; a refused
 * attach (the reply ATTACH with a null terminus, then DETACH with an error) rejects with the
 * condition. */
function attach(conn, role, opts) {
  const link = role === 'receiver' ? conn.open_receiver(opts) : conn.open_sender(opts);
  const wrapped = role === 'receiver' ? new Rx(link) : new Tx(link);
  return new Promise((resolve, reject) => {
    let closed = false;
    link.once(`${role}_close`, () => { closed = true; reject(new AmqpError(`${role} detached`, link.error)); });
    link.once(`${role}_open`, () => {
      const terminus = role === 'receiver' ? link.remote.attach.source : link.remote.attach.target;
      if (terminus && terminus.type?.name !== 'Null') resolve(wrapped); // rhea decodes a null terminus as a Typed Null
      else setTimeout(() => { if (!closed) resolve(wrapped); }, 300); // refused: DETACH follows
    });
  });
}
const receiver = (conn, opts) => attach(conn, 'receiver', typeof opts === 'string' ? { source: opts } : opts);
const sender = (conn, opts) => attach(conn, 'sender', typeof opts === 'string' ? { target: opts } : opts);

/** Asserts an attach is refused with `condition`. */
async function refused(promise, condition, what = '') {
  await assert.rejects(promise, (e) => {
    assert.equal(e.condition, condition, `${what}: ${e.message}`);
    return true;
  });
}

/** A receiver with no automatic credit and no auto-accept, for credit and settlement tests. */
const manual = (conn, address, extra = {}) => receiver(conn, { source: address, credit_window: 0, autoaccept: false, ...extra });

/** Events subscriptions go live asynchronously after ATTACH and events are not replayed: sends
 * probes through `tx` until every receiver got one, then lets stragglers arrive and drops them. */
async function waitLive(tx, receivers, probe = { body: 'probe', application_properties: { probe: 'yes' } }) {
  const pending = new Set(receivers);
  const deadline = Date.now() + WAIT_MS;
  while (pending.size) {
    assert.ok(Date.now() < deadline, 'a subscription never went live');
    await tx.send({ ...probe });
    for (const r of [...pending]) {
      try {
        await r.until(() => (r.inbox.some((d) => d.message.application_properties?.probe === 'yes') ? true : undefined), 'probe', 150);
        pending.delete(r);
      } catch { /* not yet */ }
    }
  }
  await sleep(150);
  for (const r of receivers) r.inbox = r.inbox.filter((d) => d.message.application_properties?.probe !== 'yes');
}

/** A STOMP 1.2 client on the gateway's STOMP port. */
async function stomp(port = gw.stompPort) {
  const s = await StompTcp.connect(port);
  stomps.add(s);
  return s;
}
const stomps = new Set();

const it = (name, fn, opts = {}) => test(name, opts, async (t) => {
  try { await fn(t); } finally {
    await closeAll();
    for (const s of stomps) s.close();
    stomps.clear();
  }
});

// ------------------------------------------------------------------------------------------------
// the master mapping table and the quick examples
// ------------------------------------------------------------------------------------------------

it('connection: OPEN from container KubeMQ with no offered capabilities (no ANONYMOUS-RELAY)', async () => {
  const c = await connect();
  assert.equal(c.remote.open.container_id, 'KubeMQ');
  assert.equal(c.remote.open.max_frame_size, 131072);
  assert.ok(!c.remote.open.offered_capabilities || c.remote.open.offered_capabilities.length === 0, String(c.remote.open.offered_capabilities));
});

it('queues/<ch> sender → (queues, ch) accepted; queues/<ch> and /queues/<ch> receivers read the same channel', async () => {
  const ch = unique('orders');
  const c = await connect();
  const tx = await sender(c, `queues/${ch}`);
  assert.equal(tx.link.remote.attach.target.address, `queues/${ch}`);
  await tx.ok({ body: data(Buffer.from('q-1')) });
  await tx.ok({ body: 'q-2' }); // an AmqpValue string body
  const r1 = await manual(c, `queues/${ch}`);
  r1.link.add_credit(1);
  const [a] = await r1.take(1);
  a.delivery.accept();
  const r2 = await manual(c, `/queues/${ch}`);
  r2.link.add_credit(1);
  const [b] = await r2.take(1);
  b.delivery.accept();
  assert.deepEqual([text(a.message), text(b.message)], ['q-1', 'q-2']);
});

it('events/<ch> and /events/<ch> are one channel: pre-settled fan-out to every receiver', async () => {
  const ch = unique('telemetry');
  const c = await connect();
  const r1 = await receiver(c, `events/${ch}`);
  const r2 = await receiver(c, `/events/${ch}`);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [r1, r2]);
  await tx.ok({ body: data(Buffer.from('fan-out')), application_properties: { n: '1' } });
  for (const r of [r1, r2]) {
    const { message, delivery } = await r.next();
    assert.equal(text(message), 'fan-out');
    assert.equal(delivery.remote_settled, true, 'events deliveries are pre-settled');
  }
});

it('events-store/<ch> is the events-store pattern (longest prefix first), stored and read back by AMQP and STOMP', async () => {
  const ch = unique('audit');
  const c = await connect();
  const tx = await sender(c, `events-store/${ch}`);
  await tx.ok({ body: data(Buffer.from('stored-1')) }); // accepted once stored
  await tx.ok({ body: data(Buffer.from('stored-2')) });
  const r = await receiver(c, { source: `events-store/${ch}`, properties: { 'x-opt-kubemq-start': 'first' } });
  assert.equal(r.address, `events-store/${ch}`);
  assert.deepEqual((await r.take(2)).map((d) => text(d.message)), ['stored-1', 'stored-2']);
  const s = await stomp();
  await s.subscribe('s1', `/topic-store/${ch}`, { 'x-kubemq-start': 'first' });
  const m1 = await s.message('s1');
  assert.equal(m1.body.toString(), 'stored-1');
  assert.equal(m1.headers['x-kubemq-sequence'], '1', 'stored with a sequence: the events-store pattern, not events');
  assert.equal((await s.message('s1')).body.toString(), 'stored-2');
});

it('responses/<token>: a sender attaches (write-only reply token); a receiver is DETACHed amqp:not-allowed', async () => {
  const c = await connect();
  const tx = await sender(c, 'responses/abc123');
  assert.equal(tx.link.remote.attach.target.address, 'responses/abc123');
  await refused(receiver(c, 'responses/abc123'), 'amqp:not-allowed', 'receiver on responses/');
  await refused(receiver(c, '/responses/abc123'), 'amqp:not-allowed', 'receiver on /responses/');
});

it('commands/<ch> and queries/<ch>: a sender attaches as a requester (Write), a receiver as a responder (Read)', async () => {
  const c = await connect();
  for (const p of ['commands', 'queries']) {
    const ch = unique('dispatch');
    const tx = await sender(c, `${p}/${ch}`);
    assert.equal(tx.link.remote.attach.target.address, `${p}/${ch}`);
    const rx = await receiver(c, `${p}/${ch}`);
    assert.equal(rx.address, `${p}/${ch}`);
  }
});

it('bare address: JMS node capability queue → queues, topic → events, none → DefaultPattern queues', async () => {
  const c = await connect();
  // sender, bare, capability queue: lands in queues/<ch>
  const q1 = unique('bareq');
  const txq = await sender(c, { target: { address: q1, capabilities: ['queue'] } });
  await txq.ok({ body: data(Buffer.from('via-queue-hint')) });
  const rq = await manual(c, `queues/${q1}`);
  rq.link.add_credit(1);
  const [dq] = await rq.take(1);
  dq.delivery.accept();
  assert.equal(text(dq.message), 'via-queue-hint');
  // sender, bare, no hint: DefaultPattern (queues)
  const q2 = unique('bare');
  await (await sender(c, q2)).ok({ body: data(Buffer.from('via-default')) });
  const rd = await manual(c, `queues/${q2}`);
  rd.link.add_credit(1);
  const [dd] = await rd.take(1);
  dd.delivery.accept();
  assert.equal(text(dd.message), 'via-default');
  // receiver, bare, capability queue: reads queues/<ch>
  const q3 = unique('bareq');
  await (await sender(c, `queues/${q3}`)).ok({ body: data(Buffer.from('read-by-hint')) });
  const rh = await manual(c, { address: q3, capabilities: ['queue'] });
  rh.link.add_credit(1);
  const [dh] = await rh.take(1);
  dh.delivery.accept();
  assert.equal(text(dh.message), 'read-by-hint');
  // receiver, bare, capability topic: subscribes events/<ch>
  const t = unique('baret');
  const rt = await receiver(c, { source: { address: t, capabilities: ['topic'] } });
  const txe = await sender(c, `events/${t}`);
  await waitLive(txe, [rt]);
  await txe.ok({ body: data(Buffer.from('via-topic-hint')) });
  assert.equal(text((await rt.next()).message), 'via-topic-hint');
});

it('bare address with DefaultPattern events: no hint → events; the queue hint still wins', async () => {
  const c = await connect({ port: gwEvents.amqpPort });
  const ch = unique('bare-ev');
  const r = await receiver(c, ch);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [r]);
  await tx.ok({ body: data(Buffer.from('default-events')) });
  assert.equal(text((await r.next()).message), 'default-events');
  const q = unique('bare-q');
  await (await sender(c, { target: { address: q, capabilities: ['queue'] } })).ok({ body: data(Buffer.from('hinted')) });
  const rq = await manual(c, `queues/${q}`);
  rq.link.add_credit(1);
  const [d] = await rq.take(1);
  d.delivery.accept();
  assert.equal(text(d.message), 'hinted');
});

it('a bare address with "/" and no known prefix is amqp:not-found (only one leading "/" is stripped)', async () => {
  const c = await connect();
  for (const addr of ['orders/new', 'nosuchprefix/x', 'queue/x', 'topic/x', '//queues/x', 'Queues/x']) {
    await refused(receiver(c, addr), 'amqp:not-found', `receiver ${addr}`);
    await refused(sender(c, addr), 'amqp:not-found', `sender ${addr}`);
  }
});

it('bad channels are DETACHed amqp:not-found on receivers and senders (connector charset)', async () => {
  const c = await connect();
  const bad = ['queues/', 'events/', 'events-store/', 'commands/', 'queries/', 'queues/orders.', 'queues/my orders',
    'queues/tab\there', 'queues/orders.*', 'queues/orders.>', 'queues/a:b', 'events/x;y', `queues/${'c'.repeat(256)}`, `events/${'c'.repeat(300)}`];
  for (const addr of bad) {
    await refused(receiver(c, addr), 'amqp:not-found', `receiver ${addr}`);
    await refused(sender(c, addr), 'amqp:not-found', `sender ${addr}`);
  }
  // The limit is inclusive, and "." separates segments.
  await sender(c, `queues/${'c'.repeat(255)}`);
  await sender(c, 'queues/region.eu.orders');
});

// ------------------------------------------------------------------------------------------------
// dynamic and anonymous termini
// ------------------------------------------------------------------------------------------------

it('dynamic receiver: a minted _amqp10.tmp.<conn>.<uuid>, reached by this connection only, gone with its link', async () => {
  const c = await connect();
  const other = await connect();
  const r = await receiver(c, { source: { dynamic: true } });
  const addr = r.address;
  assert.match(addr, DYNAMIC);
  const r2 = await receiver(c, { source: { dynamic: true } });
  assert.notEqual(r2.address, addr);
  assert.equal(r2.address.split('.')[2], addr.split('.')[2], 'one connection number for both nodes');
  const anon = await sender(c, { target: {} });
  await anon.ok({ to: addr, body: data(Buffer.from('to my node')) });
  assert.equal(text((await r.next()).message), 'to my node');
  const foreign = await sender(other, { target: {} });
  const o = await foreign.send({ to: addr, body: data(Buffer.from('foreign')) });
  assert.deepEqual([o.state, o.condition], ['rejected', 'amqp:precondition-failed']);
  await new Promise((resolve) => { r.link.once('receiver_close', resolve); r.link.close(); });
  const late = await anon.send({ to: addr, body: data(Buffer.from('late')) });
  assert.deepEqual([late.state, late.condition], ['rejected', 'amqp:precondition-failed']);
  await anon.ok({ to: r2.address, body: data(Buffer.from('still here')) });
  assert.equal(text((await r2.next()).message), 'still here');
});

it('dynamic sender (target.dynamic=true, empty address): the server mints a node, echoes it, and a receiver on its address reads it', async () => {
  const c = await connect();
  const tx = await sender(c, { target: { dynamic: true } });
  const addr = tx.link.remote.attach.target.address ?? '';
  assert.match(addr, DYNAMIC);
  // A mailbox with no reader yet is unreachable.
  const early = await tx.send({ body: data(Buffer.from('nobody reads')) });
  assert.deepEqual([early.state, early.condition], ['rejected', 'amqp:precondition-failed']);
  const r = await receiver(c, addr);
  await tx.ok({ body: data(Buffer.from('to the minted node')) });
  const { message, delivery } = await r.next();
  assert.equal(text(message), 'to the minted node');
  assert.equal(delivery.remote_settled, true, 'dynamic node deliveries are pre-settled');
  // The node goes with the sender's link.
  await new Promise((resolve) => { tx.link.once('sender_close', resolve); tx.link.close(); });
  const anon = await sender(c, { target: {} });
  const late = await anon.send({ to: addr, body: data(Buffer.from('late')) });
  assert.deepEqual([late.state, late.condition], ['rejected', 'amqp:precondition-failed']);
});

it('anonymous (null-target) sender routes each message by `to`: queues, /queues, events, events-store, bare', async () => {
  const c = await connect();
  const ch = unique('anon');
  const ev = await receiver(c, `events/${ch}`);
  const anon = await sender(c, { target: {} });
  await anon.ok({ to: `queues/${ch}`, body: data(Buffer.from('to a queue')) });
  await anon.ok({ to: `/queues/${ch}`, body: data(Buffer.from('leading slash')) });
  await anon.ok({ to: `events-store/${ch}`, body: data(Buffer.from('to the store')) });
  await anon.ok({ to: `${ch}`, body: data(Buffer.from('bare: DefaultPattern queues')) });
  const q = await manual(c, `queues/${ch}`);
  q.link.add_credit(3);
  const got = await q.take(3);
  for (const d of got) d.delivery.accept();
  assert.deepEqual(got.map((d) => text(d.message)).sort(), ['bare: DefaultPattern queues', 'leading slash', 'to a queue']);
  const st = await receiver(c, { source: `events-store/${ch}`, properties: { 'x-opt-kubemq-start': 'first' } });
  assert.equal(text((await st.next()).message), 'to the store');
  const evTx = { send: (m) => anon.send({ ...m, to: `events/${ch}` }) };
  await waitLive(evTx, [ev]);
  await anon.ok({ to: `events/${ch}`, body: data(Buffer.from('to events')) });
  assert.equal(text((await ev.next()).message), 'to events');
});

it('anonymous sender: a missing or unroutable `to` is rejected amqp:precondition-failed and the link stays', async () => {
  const c = await connect();
  const ch = unique('after');
  const anon = await sender(c, { target: {} });
  for (const to of [undefined, '', 'nosuchprefix/x', 'queues/', 'queues/a b', 'events/x;y', 'responses/', '_amqp10.tmp.1.00000000-0000-0000-0000-000000000000']) {
    const m = { body: data(Buffer.from('nowhere')) };
    if (to !== undefined) m.to = to;
    const o = await anon.send(m);
    assert.deepEqual([o.state, o.condition], ['rejected', 'amqp:precondition-failed'], `to=${JSON.stringify(to)}`);
  }
  await anon.ok({ to: `queues/${ch}`, body: data(Buffer.from('after')) });
  const q = await manual(c, `queues/${ch}`);
  q.link.add_credit(1);
  const [d] = await q.take(1);
  d.delivery.accept();
  assert.equal(text(d.message), 'after');
});

// ------------------------------------------------------------------------------------------------
// queues: credit, drain, settlement
// ------------------------------------------------------------------------------------------------

/** Fills `queues/<ch>` with `bodies` (each accepted once the queue holds it). */
async function fill(c, ch, bodies) {
  const tx = await sender(c, `queues/${ch}`);
  for (const b of bodies) await tx.ok({ body: data(Buffer.from(b)) });
  return tx;
}

it('queue credit: a receiver granted N gets exactly N; more credit brings the rest', async () => {
  const c = await connect();
  const ch = unique('credit');
  const bodies = ['m0', 'm1', 'm2', 'm3', 'm4', 'm5'];
  await fill(c, ch, bodies);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(4);
  const first = await r.take(4);
  assert.deepEqual(await r.quiet(500), [], 'nothing past the credit');
  assert.equal(r.link.credit, 0);
  for (const d of first) d.delivery.accept();
  r.link.add_credit(2);
  const rest = await r.take(2);
  for (const d of rest) d.delivery.accept();
  assert.deepEqual([...first, ...rest].map((d) => text(d.message)), bodies, 'in queue order');
});

it('drain: the gateway uses what it can of the credit, then answers drain with credit 0', async () => {
  const c = await connect();
  const ch = unique('drain');
  await fill(c, ch, ['d0', 'd1']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(10);
  const got = await r.take(2);
  for (const d of got) d.delivery.accept();
  r.link.drain_credit();
  await r.until(() => (r.drained ? true : undefined), 'drained FLOW');
  assert.equal(r.link.credit, 0, 'drain leaves no credit');
  assert.deepEqual(got.map((d) => text(d.message)), ['d0', 'd1']);
  // No credit: a new message waits in the queue.
  const tx = await sender(c, `queues/${ch}`);
  await tx.ok({ body: data(Buffer.from('d2')) });
  assert.deepEqual(await r.quiet(400), []);
  r.link.drain = false;
  r.link.add_credit(1);
  const [d2] = await r.take(1);
  d2.delivery.accept();
  assert.equal(text(d2.message), 'd2');
});

it('drain on an empty queue: FLOW drain echoes credit 0 and no transfer', async () => {
  const c = await connect();
  const r = await manual(c, `queues/${unique('empty')}`);
  r.link.add_credit(5);
  r.link.drain_credit();
  await r.until(() => (r.drained ? true : undefined), 'drained FLOW');
  assert.equal(r.link.credit, 0);
  assert.equal(r.inbox.length, 0);
});

it('released → redelivered; accepted → gone', async () => {
  const c = await connect();
  const ch = unique('release');
  await fill(c, ch, ['r0', 'r1']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [a] = await r.take(1);
  assert.equal(text(a.message), 'r0');
  a.delivery.release();
  r.link.add_credit(2);
  const got = await r.take(2);
  const again = got.find((d) => text(d.message) === 'r0');
  assert.ok(again, `r0 redelivered: ${got.map((d) => text(d.message))}`);
  for (const d of got) d.delivery.accept();
  r.link.add_credit(5);
  assert.deepEqual(await r.quiet(400), [], 'accepted messages are gone');
});

it('rejected → discarded, never redelivered', async () => {
  const c = await connect();
  const ch = unique('reject');
  await fill(c, ch, ['bad', 'good']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [a] = await r.take(1);
  assert.equal(text(a.message), 'bad');
  a.delivery.reject({ condition: 'amqp:decode-error', description: 'poison' });
  r.link.add_credit(5);
  const rest = await r.take(1);
  rest[0].delivery.accept();
  assert.equal(text(rest[0].message), 'good');
  assert.deepEqual(await r.quiet(400), [], 'the rejected message does not come back');
});

it('modified (delivery-failed) → requeued and redelivered', async () => {
  const c = await connect();
  const ch = unique('modified');
  await fill(c, ch, ['mod']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [a] = await r.take(1);
  a.delivery.modified({ delivery_failed: true });
  r.link.add_credit(1);
  const [b] = await r.take(1);
  assert.equal(text(b.message), 'mod');
  b.delivery.accept();
  r.link.add_credit(1);
  assert.deepEqual(await r.quiet(300), []);
});

it('detaching with unsettled deliveries gives them back to the queue', async () => {
  const c = await connect();
  const ch = unique('detach');
  await fill(c, ch, ['held']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  await r.take(1); // never settled
  await new Promise((resolve) => { r.link.once('receiver_close', resolve); r.link.close(); });
  const r2 = await manual(c, `queues/${ch}`);
  r2.link.add_credit(1);
  const [d] = await r2.take(1);
  d.delivery.accept();
  assert.equal(text(d.message), 'held');
});

it('a redelivery shows delivery-count = ReceiveCount - 1 and first-acquirer = (ReceiveCount == 1)', async () => {
  const c = await connect();
  const ch = unique('header');
  await fill(c, ch, ['h']);
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [a] = await r.take(1);
  assert.equal(a.message.first_acquirer, true, 'first delivery: first-acquirer true');
  assert.equal(a.message.delivery_count ?? 0, 0);
  a.delivery.release();
  r.link.add_credit(1);
  const [b] = await r.take(1);
  b.delivery.modified({ delivery_failed: true });
  r.link.add_credit(1);
  const [d] = await r.take(1);
  d.delivery.accept();
  assert.equal(b.message.delivery_count, 1, 'after one release');
  // The encoder writes a field at its default as null (AMQP 1.0 part 1.4: null = the default).
  assert.equal(b.message.first_acquirer ?? false, false);
  assert.equal(d.message.delivery_count, 2, 'after a release and a modified');
});

it('a queue consumer that settled its only credit holds nothing: the next message goes to the other consumer', async () => {
  const c = await connect();
  const ch = unique('prefetch');
  await fill(c, ch, ['p0', 'p1']);
  const first = await manual(c, `queues/${ch}`);
  first.link.add_credit(1);
  const [a] = await first.take(1);
  a.delivery.accept(); // credit 0 now, and it stays 0
  await sleep(100);
  const second = await manual(c, `queues/${ch}`);
  second.link.add_credit(1);
  const [b] = await second.take(1, 1500);
  b.delivery.accept();
  assert.equal(text(b.message), 'p1');
});

it('at-most-once producer on queues: pre-settled (snd-settle-mode settled) transfers are queued', async () => {
  const c = await connect();
  const ch = unique('presettled-in');
  const tx = await sender(c, { target: `queues/${ch}`, snd_settle_mode: 1 });
  assert.equal(tx.link.remote.attach.snd_settle_mode, 1);
  await tx.send({ body: data(Buffer.from('p0')) });
  await tx.send({ body: data(Buffer.from('p1')) });
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(2);
  const got = await r.take(2);
  for (const d of got) d.delivery.accept();
  assert.deepEqual(got.map((d) => text(d.message)), ['p0', 'p1']);
});

it('at-most-once consumer on queues: snd-settle-mode=settled + rcv-settle-mode=first gets pre-settled deliveries, not given back', async () => {
  const c = await connect();
  const ch = unique('presettled-out');
  await fill(c, ch, ['p0', 'p1']);
  const r = await manual(c, `queues/${ch}`, { snd_settle_mode: 1, rcv_settle_mode: 0 });
  assert.equal(r.link.remote.attach.snd_settle_mode, 1);
  r.link.add_credit(1);
  const [a] = await r.take(1);
  assert.equal(text(a.message), 'p0');
  assert.equal(a.delivery.remote_settled, true, 'pre-settled by the gateway');
  await new Promise((resolve) => { r.link.once('receiver_close', resolve); r.link.close(); });
  // At most once: p0 is not given back on detach.
  const r2 = await manual(c, `queues/${ch}`);
  r2.link.add_credit(2);
  const got = await r2.quiet(500);
  for (const d of got) d.delivery.accept();
  assert.deepEqual(got.map((d) => text(d.message)), ['p1']);
});

it('rcv-settle-mode second is refused amqp:not-implemented', async () => {
  const c = await connect();
  await refused(receiver(c, { source: `queues/${unique('second')}`, rcv_settle_mode: 1 }), 'amqp:not-implemented', 'receiver, queues');
  await refused(sender(c, { target: `queues/${unique('second')}`, rcv_settle_mode: 1 }), 'amqp:not-implemented', 'sender, queues');
});

it('refused on queues: copy distribution → invalid-field, selector → not-implemented', async () => {
  const c = await connect();
  const ch = unique('refuse');
  await refused(receiver(c, { source: { address: `queues/${ch}`, distribution_mode: 'copy' } }), 'amqp:invalid-field', 'copy');
  await refused(receiver(c, { source: { address: `queues/${ch}`, filter: rhea.filter.selector("a = '1'") } }), 'amqp:not-implemented', 'selector');
  // move is the queues' own mode
  await receiver(c, { source: { address: `queues/${ch}`, distribution_mode: 'move' } });
});

it('a 1 MiB message crosses in many frames byte-exact, AMQP in and out through a queue', async () => {
  const c = await connect();
  const ch = unique('big');
  const big = Buffer.alloc(1 << 20);
  for (let i = 0; i < big.length; i++) big[i] = (i * 131 + (i >> 13)) & 0xff;
  const tx = await sender(c, `queues/${ch}`);
  await tx.ok({ body: data(big), application_properties: { size: String(big.length) } });
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [d] = await r.take(1, 10000);
  d.delivery.accept();
  const got = bodyOf(d.message);
  assert.equal(got.length, big.length);
  assert.ok(got.equals(big), 'byte-exact');
  assert.equal(d.message.application_properties.size, String(big.length));
});

// ------------------------------------------------------------------------------------------------
// events and events-store
// ------------------------------------------------------------------------------------------------

it('events: a transfer for a receiver with no link credit is dropped, not kept for later credit', async () => {
  const c = await connect();
  const ch = unique('nocredit');
  const live = await receiver(c, `events/${ch}`);
  const starved = await receiver(c, { source: `events/${ch}`, credit_window: 0 });
  starved.link.add_credit(1);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [live, starved]); // uses starved's one credit
  await tx.ok({ body: data(Buffer.from('dropped')) });
  assert.equal(text((await live.next()).message), 'dropped');
  starved.link.add_credit(5);
  assert.deepEqual(await starved.quiet(400), [], 'no replay after credit');
  await tx.ok({ body: data(Buffer.from('kept')) });
  assert.equal(text((await starved.next()).message), 'kept');
});

it('a selector on events filters by application properties and is echoed in the ATTACH reply', async () => {
  const c = await connect();
  const ch = unique('sel');
  const sel = "color = 'blue' AND size > 10";
  const r = await receiver(c, { source: { address: `events/${ch}`, filter: rhea.filter.selector(sel) } });
  const echoed = r.link.remote.attach.source.filter;
  assert.ok(echoed && Object.values(echoed).some((v) => v?.value === sel || v === sel), JSON.stringify(echoed));
  const all = await receiver(c, `events/${ch}`);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [r, all], { body: 'probe', application_properties: { probe: 'yes', color: 'blue', size: 99 } });
  for (const props of [{ color: 'red', size: 20 }, { color: 'blue', size: 3 }, { color: 'blue' }, {}]) {
    await tx.ok({ body: data(Buffer.from('no')), application_properties: props });
  }
  await tx.ok({ body: data(Buffer.from('yes')), application_properties: { color: 'blue', size: 11 } });
  assert.deepEqual((await r.quiet(400)).map((d) => text(d.message)), ['yes']);
  assert.equal((await all.quiet(200)).length, 5);
  await refused(receiver(c, { source: { address: `events/${ch}`, filter: rhea.filter.selector('color = ') } }), 'amqp:invalid-field', 'bad selector');
});

it('x-opt-kubemq-group: two group members share the events, a groupless receiver gets all', async () => {
  const c = await connect();
  const ch = unique('group');
  const props = { 'x-opt-kubemq-group': 'g1' };
  const a = await receiver(c, { source: `events/${ch}`, properties: props });
  const b = await receiver(c, { source: `events/${ch}`, properties: props });
  const solo = await receiver(c, `events/${ch}`);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [solo]);
  await waitLive(tx, [a, b]);
  a.inbox = []; b.inbox = []; solo.inbox = [];
  const sent = Array.from({ length: 10 }, (_, i) => `g-${i}`);
  for (const s of sent) await tx.ok({ body: data(Buffer.from(s)) });
  const [ga, gb, gs] = await Promise.all([a.quiet(), b.quiet(), solo.quiet()]);
  assert.deepEqual([...ga, ...gb].map((d) => text(d.message)).sort(), [...sent].sort());
  assert.ok(ga.length && gb.length, `both members get some: ${ga.length}/${gb.length}`);
  assert.deepEqual(gs.map((d) => text(d.message)), sent);
});

it('events-store start positions: first, last, sequence:n, time-delta, new-only; malformed → invalid-field', async () => {
  const c = await connect();
  const ch = unique('starts');
  const tx = await sender(c, `events-store/${ch}`);
  for (const i of [1, 2, 3]) await tx.ok({ body: data(Buffer.from(`e${i}`)) });
  const expected = { first: ['e1', 'e2', 'e3'], last: ['e3'], 'sequence:2': ['e2', 'e3'], 'time-delta:3600': ['e1', 'e2', 'e3'] };
  const starts = {};
  for (const [start, want] of Object.entries(expected)) {
    starts[start] = await receiver(c, { source: `events-store/${ch}`, properties: { 'x-opt-kubemq-start': start } });
    assert.deepEqual((await starts[start].take(want.length)).map((d) => text(d.message)), want, start);
  }
  const fresh = await receiver(c, { source: `events-store/${ch}`, properties: { 'x-opt-kubemq-start': 'new-only' } });
  const none = await receiver(c, `events-store/${ch}`); // absent = new-only
  assert.deepEqual(await fresh.quiet(300), []);
  assert.deepEqual(await none.quiet(100), []);
  await tx.ok({ body: data(Buffer.from('e4')) });
  for (const r of [fresh, none, ...Object.values(starts)]) assert.equal(text((await r.next()).message), 'e4');
  for (const bad of ['sequence:zero', 'sequence:', 'bogus', 'time:not-a-time', 'time-delta:-']) {
    await refused(receiver(c, { source: `events-store/${ch}`, properties: { 'x-opt-kubemq-start': bad } }), 'amqp:invalid-field', bad);
  }
});

it('a selector on events-store (IN, LIKE, BETWEEN, IS NULL) with start first replays only the matches', async () => {
  const c = await connect();
  const ch = `events-store/${unique('sel-store')}`;
  const tx = await sender(c, ch);
  const rows = [['eu', 'order-1'], ['us', 'order-2'], ['eu', 'refund-3'], ['apac', 'order-4']];
  for (const [i, [region, name]] of rows.entries()) await tx.ok({ body: data(Buffer.from(name)), application_properties: { region, name, n: i } });
  const sel = "region IN ('eu', 'apac') AND name LIKE 'order%' AND n BETWEEN 0 AND 10 AND missing IS NULL";
  const r = await receiver(c, { source: { address: ch, filter: rhea.filter.selector(sel) }, properties: { 'x-opt-kubemq-start': 'first' } });
  assert.deepEqual((await r.take(2)).map((d) => text(d.message)), ['order-1', 'order-4']);
  assert.deepEqual(await r.quiet(300), []);
});

it('durable events-store identity (container-id + link name, expiry-policy never): live once, re-attach resumes', async () => {
  const ch = `events-store/${unique('durable')}`;
  const cid = unique('app');
  const durable = (extra = {}) => ({ name: 'audit', source: { address: ch, durable: 2, expiry_policy: 'never' }, ...extra });
  const pub = await connect();
  const tx = await sender(pub, ch);
  for (const i of [1, 2, 3]) await tx.ok({ body: data(Buffer.from(`d${i}`)) });
  const c1 = await connect({ id: cid });
  const r1 = await receiver(c1, durable({ properties: { 'x-opt-kubemq-start': 'first' } }));
  assert.equal(r1.link.remote.attach.source.expiry_policy, 'never');
  assert.deepEqual((await r1.take(3)).map((d) => text(d.message)), ['d1', 'd2', 'd3']);
  // The same identity live on another connection: not allowed.
  const c2 = await connect({ id: cid });
  await refused(receiver(c2, durable()), 'amqp:not-allowed', 'second live attach');
  // Detach (not close): the subscription is inactive, not cancelled.
  await new Promise((resolve) => { r1.link.once('receiver_close', resolve); r1.link.detach(); });
  for (const i of [4, 5]) await tx.ok({ body: data(Buffer.from(`d${i}`)) });
  const c3 = await connect({ id: cid });
  const r3 = await receiver(c3, durable());
  assert.deepEqual((await r3.take(2)).map((d) => text(d.message)), ['d4', 'd5']);
  assert.deepEqual(await r3.quiet(300), [], 'resumes after d3, nothing twice');
  // Another link name is another identity.
  await receiver(c2, durable({ name: 'audit-2' }));
});

// ------------------------------------------------------------------------------------------------
// RPC
// ------------------------------------------------------------------------------------------------

/** Sends requests through `tx` until the responder `rx` gets one (a responder registers with the
 * array asynchronously after its ATTACH; earlier requests get no-responder answers). */
async function firstRequest(tx, rx, msg) {
  const deadline = Date.now() + WAIT_MS;
  for (let i = 0; ; i++) {
    assert.ok(Date.now() < deadline, 'no request reached the responder');
    await tx.ok({ ...msg, correlation_id: `${msg.correlation_id}-${i}` });
    try { return await rx.next(250); } catch { /* not registered yet */ }
  }
}

it('command RPC: rhea requester (dynamic reply node) answered by a rhea responder through a responses/ sender', async () => {
  const ch = unique('cmd');
  const req = await connect();
  const resp = await connect();
  const responder = await receiver(resp, `commands/${ch}`);
  const reply = await receiver(req, { source: { dynamic: true } });
  const tx = await sender(req, `commands/${ch}`);
  const got = await firstRequest(tx, responder, { body: data(Buffer.from('do it')), reply_to: reply.address, correlation_id: 'corr', application_properties: { 'x-trace': 'abc' } });
  const m = got.message;
  assert.equal(text(m), 'do it');
  assert.match(m.correlation_id, /^corr-\d+$/);
  assert.equal(m.application_properties['x-trace'], 'abc');
  assert.match(m.reply_to, /^responses\/\S+$/);
  const answer = await sender(resp, m.reply_to); // a fixed-target sender to responses/<RequestID>
  await answer.ok({ body: data(Buffer.from('done')), application_properties: { 'x-opt-kubemq-executed': true, 'a-tag': 'av' } });
  let r;
  do { r = (await reply.next()).message; } while (r.correlation_id !== m.correlation_id); // earlier ones: no responder yet
  assert.equal(text(r), 'done');
  assert.equal(r.application_properties['x-opt-kubemq-executed'], true);
  assert.equal(r.application_properties['a-tag'], 'av');
  assert.ok(!('x-opt-kubemq-error' in r.application_properties), JSON.stringify(r.application_properties));
});

it('query RPC: answered by an anonymous sender to the responses/ token; body and metadata only', async () => {
  const ch = unique('qry');
  const c = await connect();
  const responder = await receiver(c, `queries/${ch}`);
  const reply = await receiver(c, { source: { dynamic: true } });
  const tx = await sender(c, `queries/${ch}`);
  const { message: m } = await firstRequest(tx, responder, { body: data(Buffer.from('lookup')), reply_to: reply.address, correlation_id: 'q', ttl: 2000 });
  const anon = await sender(c, { target: {} });
  await anon.ok({ to: m.reply_to, body: data(Buffer.from('found')), application_properties: { hits: '3' } });
  const r = (await reply.next()).message; // a failed (no-responder) query gets no reply at all
  assert.equal(r.correlation_id, m.correlation_id);
  assert.equal(text(r), 'found');
  assert.equal(r.application_properties.hits, '3');
  assert.ok(!('x-opt-kubemq-executed' in r.application_properties), JSON.stringify(r.application_properties));
});

it('command RPC error: executed=false and x-opt-kubemq-error reach the requester; no responder → executed=false', async () => {
  const ch = unique('cmd-err');
  const c = await connect();
  const reply = await receiver(c, { source: { dynamic: true } });
  const tx = await sender(c, `commands/${ch}`);
  // No responder yet: a message-id and no correlation-id → the reply correlates by message-id.
  await tx.ok({ body: data(Buffer.from('x')), reply_to: reply.address, message_id: 'mid-1', ttl: 1000 });
  const none = (await reply.next()).message;
  assert.equal(none.correlation_id, 'mid-1');
  assert.equal(none.application_properties['x-opt-kubemq-executed'], false);
  assert.ok(none.application_properties['x-opt-kubemq-error'], JSON.stringify(none.application_properties));
  const responder = await receiver(c, `commands/${ch}`);
  const { message: m } = await firstRequest(tx, responder, { body: data(Buffer.from('do')), reply_to: reply.address, correlation_id: 'e' });
  await (await sender(c, { target: {} })).ok({ to: m.reply_to, body: data(Buffer.alloc(0)), application_properties: { 'x-opt-kubemq-executed': false, 'x-opt-kubemq-error': 'boom' } });
  let r;
  do { r = (await reply.next()).message; } while (r.correlation_id !== m.correlation_id);
  assert.equal(r.application_properties['x-opt-kubemq-executed'], false);
  assert.equal(r.application_properties['x-opt-kubemq-error'], 'boom');
});

it('a query without responder gets no reply; a reply-to the connection does not own is not-allowed', async () => {
  const ch = unique('q-none');
  const c = await connect();
  const other = await connect();
  const reply = await receiver(c, { source: { dynamic: true } });
  const q = await sender(c, `queries/${ch}`);
  await q.ok({ body: data(Buffer.from('y')), reply_to: reply.address, correlation_id: 'q-1', ttl: 1000 });
  assert.deepEqual(await reply.quiet(2000), [], 'a failed query produces no reply');
  const foreign = (await receiver(other, { source: { dynamic: true } })).address;
  const cmd = await sender(c, `commands/${ch}`);
  for (const replyTo of [undefined, 'queues/replies', foreign]) {
    const m = { body: data(Buffer.from('x')), correlation_id: 'c' };
    if (replyTo) m.reply_to = replyTo;
    const o = await cmd.send(m);
    assert.deepEqual([o.state, o.condition], ['rejected', 'amqp:not-allowed'], `reply-to ${replyTo}`);
  }
});

// ------------------------------------------------------------------------------------------------
// AMQP <-> STOMP on one channel
// ------------------------------------------------------------------------------------------------

const BINARY = Buffer.from([0x00, 0x01, 0x0a, 0x00, 0xff, 0xfe, 0x80, 0x7f, 0x3a, 0x5c]);

it('AMQP → STOMP on a queue: body byte-exact, content-type, correlation-id and a custom property', async () => {
  const ch = unique('x-a2s');
  const c = await connect();
  const tx = await sender(c, `queues/${ch}`);
  await tx.ok({ body: data(BINARY), content_type: 'application/octet-stream', correlation_id: 'corr-a2s', application_properties: { color: 'blue' } });
  const s = await stomp();
  await s.subscribe('q', `/queue/${ch}`);
  const f = await s.message('q');
  assert.ok(f.body.equals(BINARY), f.body.toString('hex'));
  assert.equal(f.headers['content-type'], 'application/octet-stream');
  assert.equal(f.headers['correlation-id'], 'corr-a2s');
  assert.equal(f.headers.color, 'blue');
  assert.equal(f.headers.destination, `/queue/${ch}`);
});

it('STOMP → AMQP on a queue: body byte-exact, content-type, correlation-id and a custom header', async () => {
  const ch = unique('x-s2a');
  const s = await stomp();
  await s.receipted('SEND', { destination: `/queue/${ch}`, 'content-type': 'text/plain;charset=utf-8', 'correlation-id': 'corr-s2a', flavour: 'mint' }, BINARY);
  const c = await connect();
  const r = await manual(c, `queues/${ch}`);
  r.link.add_credit(1);
  const [{ message: m, delivery }] = await r.take(1);
  delivery.accept();
  assert.ok(bodyOf(m).equals(BINARY), bodyOf(m).toString('hex'));
  assert.equal(m.content_type, 'text/plain;charset=utf-8');
  assert.equal(m.correlation_id, 'corr-s2a');
  assert.equal(m.application_properties?.flavour, 'mint');
});

it('AMQP ↔ STOMP on events: both directions on one channel with the same properties', async () => {
  const ch = unique('x-ev');
  const s = await stomp();
  await s.subscribe('t', `/topic/${ch}`);
  const c = await connect();
  const r = await receiver(c, `events/${ch}`);
  const tx = await sender(c, `events/${ch}`);
  await waitLive(tx, [r]);
  while (s.frames.length) s.frames.pop(); // the probes reached STOMP too
  await tx.ok({ body: data(Buffer.from('from-amqp')), content_type: 'text/plain', correlation_id: 'ev-1', application_properties: { color: 'green' } });
  const f = await s.next((fr) => fr.command === 'MESSAGE' && fr.body.toString() === 'from-amqp');
  assert.equal(f.headers['content-type'], 'text/plain');
  assert.equal(f.headers['correlation-id'], 'ev-1');
  assert.equal(f.headers.color, 'green');
  r.inbox = [];
  await s.receipted('SEND', { destination: `/topic/${ch}`, 'content-type': 'application/json', 'correlation-id': 'ev-2', flavour: 'lime' }, '{"a":1}');
  let m;
  do { m = (await r.next()).message; } while (text(m) !== '{"a":1}');
  assert.equal(m.content_type, 'application/json');
  assert.equal(m.correlation_id, 'ev-2');
  assert.equal(m.application_properties?.flavour, 'lime');
});

// ------------------------------------------------------------------------------------------------
// authorization (the seed's "Server role and authorization" table)
// ------------------------------------------------------------------------------------------------

it('--authz-file: Read at receiver attach, Write at sender attach, per-message Write on the anonymous sender, none for responses/ and dynamic nodes', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'rhea-authz-'));
  const rules = path.join(dir, 'rules.json');
  writeFileSync(rules, JSON.stringify([
    { ClientID: 'rhea-alice', Queues: true, Channel: 'ok\\..*', Read: true, Write: true },
    { ClientID: 'rhea-alice', Events: true, Channel: 'ro\\..*', Read: true, Write: false },
  ]));
  const g = await startAmqpGateway(['--authz-file', rules]);
  try {
    const u = unique('z');
    const c = await connect({ id: 'rhea-alice', port: g.amqpPort }); // no SASL username: the container-id is the client id
    await receiver(c, `queues/ok.${u}`);
    await (await sender(c, `queues/ok.${u}`)).ok({ body: data(Buffer.from('allowed')) });
    await refused(receiver(c, `queues/no.${u}`), 'amqp:unauthorized-access', 'receiver without Read');
    await refused(sender(c, `queues/no.${u}`), 'amqp:unauthorized-access', 'sender without Write');
    await receiver(c, `events/ro.${u}`);
    await refused(sender(c, `events/ro.${u}`), 'amqp:unauthorized-access', 'events sender on a Read-only rule');
    await refused(receiver(c, `events-store/ok.${u}`), 'amqp:unauthorized-access', 'no events-store rule');
    const anon = await sender(c, { target: {} }); // no attach-time check
    const denied = await anon.send({ to: `queues/no.${u}`, body: data(Buffer.from('denied')) });
    assert.deepEqual([denied.state, denied.condition], ['rejected', 'amqp:unauthorized-access']);
    await anon.ok({ to: `queues/ok.${u}`, body: data(Buffer.from('allowed-anon')) });
    const dyn = await receiver(c, { source: { dynamic: true } }); // no authz on a dynamic node
    await anon.ok({ to: dyn.address, body: data(Buffer.from('mine')) });
    assert.equal(text((await dyn.next()).message), 'mine');
    await sender(c, 'responses/abc123'); // the reply token is not checked
    // Another client id is judged on its own: nothing allowed.
    const bob = await connect({ id: 'rhea-bob', port: g.amqpPort });
    await refused(receiver(bob, `queues/ok.${u}`), 'amqp:unauthorized-access', 'bob');
  } finally {
    await closeAll();
    await g.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
