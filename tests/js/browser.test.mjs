// A real headless Chromium (Debian's `chromium`, driven by puppeteer-core over the DevTools
// protocol) loads a page served from 127.0.0.1 that loads @stomp/stompjs's browser bundle from
// node_modules, and reaches every pattern of one stompgate over ws://: events, events-store,
// queues with client ack, and commands and queries whose responders are native KubeMQ gRPC
// clients in this Node process (STOMP is requester-only: a STOMP SUBSCRIBE to /command/ or
// /query/ is refused, seed 003). The gateway allows only the page's origin; a page from
// another origin is refused at the handshake. Authentication is on (JWT in CONNECT's
// passcode, as a browser must send it) and the page also reaches wss:// with the committed
// self-signed test certificate (tests/js/fixtures). One gateway and one browser serve every case.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';
import grpc from '@grpc/grpc-js';
import { startGateway, freePort } from './gateway.mjs';
import { kubemqClient, responder as grpcResponder, SUBSCRIBE_COMMANDS, SUBSCRIBE_QUERIES } from './responder.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
const STOMPJS_BUNDLE = path.join(here, 'node_modules', '@stomp', 'stompjs', 'bundles', 'stomp.umd.min.js');
// Non-ASCII UTF-8 of 2, 3 and 4 bytes a character, compared byte for byte after the trip.
const TEXT = 'grüße, 東京 — ✓ 🚀';
const TLS_CERT = path.join(here, 'fixtures', 'wss-cert.pem');
const TLS_KEY = path.join(here, 'fixtures', 'wss-key.pem');
const JWT_SECRET = crypto.randomBytes(32).toString('hex');

let gw;
let browser;
let launching; // the browser's start, awaited by after() too if before() fails midway
let page; // served from the allowed origin
let pageServer;
let foreignServer; // the same page from another origin (another port)
let kubemq; // a gRPC client of the gateway's KubeMQ API
let grpcAuth; // its `authorization` metadata (the same JWT as the page's passcode)
let wssUrl;
let secretDir;
let n = 0;
const unique = (prefix) => `${prefix}-${process.pid}-${n++}`;

/** An HS256 JWT, signed here with node:crypto (no JWT library needed for one algorithm). */
function jwt(claims, secret = JWT_SECRET) {
  const part = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const unsigned = `${part({ alg: 'HS256', typ: 'JWT' })}.${part(claims)}`;
  return `${unsigned}.${crypto.createHmac('sha256', secret).update(unsigned).digest('base64url')}`;
}
const token = (sub) => jwt({ sub, exp: Math.floor(Date.now() / 1000) + 3600 });

/** Chromium's --ignore-certificate-errors-spki-list value for a certificate: the base64 of the
 * SHA-256 of its public key (SPKI). Only that certificate is let through, not every one. */
function spkiHash(certFile) {
  const spki = new crypto.X509Certificate(fs.readFileSync(certFile)).publicKey.export({ type: 'spki', format: 'der' });
  return crypto.createHash('sha256').update(spki).digest('base64');
}

/** Serves the page (tests/js/page) and the stompjs bundle on 127.0.0.1, on a free port. */
function servePage() {
  const files = {
    '/': ['text/html; charset=utf-8', path.join(here, 'page', 'index.html')],
    '/page.js': ['text/javascript; charset=utf-8', path.join(here, 'page', 'page.js')],
    '/stomp.umd.min.js': ['text/javascript; charset=utf-8', STOMPJS_BUNDLE],
  };
  const server = http.createServer((req, res) => {
    const file = files[req.url];
    if (req.url === '/favicon.ico') { res.writeHead(204).end(); return; }
    if (!file) { res.writeHead(404).end(); return; }
    res.writeHead(200, { 'content-type': file[0] }).end(fs.readFileSync(file[1]));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
    server.origin = `http://127.0.0.1:${server.address().port}`;
    resolve(server);
  }));
}

async function openPage(origin) {
  const p = await browser.newPage();
  p.on('pageerror', (e) => { console.error(`page error (${origin}): ${e.message}`); });
  await p.goto(`${origin}/`, { waitUntil: 'load' });
  await p.waitForFunction(() => typeof window.StompJs === 'object' && typeof window.connect === 'function');
  // Every connect() of the page logs in with a valid JWT unless a case passes its own headers.
  await p.evaluate((passcode) => { window.defaultConnectHeaders = { login: 'browser', passcode }; }, token('browser-page'));
  return p;
}

/** A native responder on `channel` (responder.mjs), logged in with the test's JWT. */
const responder = (type, channel, answer) => grpcResponder(kubemq, type, channel, answer, grpcAuth);

before(async () => {
  // The browser and the page servers first: the gateway is told the page's origin.
  [pageServer, foreignServer] = [await servePage(), await servePage()];
  launching = puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // --no-sandbox: the tests run as root (Chromium refuses its sandbox there); the next two
    // keep it working in a container (small /dev/shm, no GPU); the last trusts the test
    // certificate of wss:// (and no other).
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--no-first-run', '--no-default-browser-check',
      `--ignore-certificate-errors-spki-list=${spkiHash(TLS_CERT)}`],
  });
  secretDir = fs.mkdtempSync(path.join(os.tmpdir(), 'stompgate-browser-'));
  const secretFile = path.join(secretDir, 'jwt.secret');
  fs.writeFileSync(secretFile, JWT_SECRET);
  const wssPort = await freePort();
  gw = await startGateway(['--ws-allowed-origins', pageServer.origin, '--auth-jwt-key', secretFile,
    '--tls-cert', TLS_CERT, '--tls-key', TLS_KEY, '--stomp-tls-addr', 'off', '--ws-tls-addr', `127.0.0.1:${wssPort}`], { grpc: true });
  wssUrl = `wss://127.0.0.1:${wssPort}/ws`;
  grpcAuth = new grpc.Metadata();
  grpcAuth.set('authorization', token('node-responder'));
  browser = await launching;
  page = await openPage(pageServer.origin);
  kubemq = kubemqClient(gw.grpcAddr);
});

after(async () => {
  kubemq?.close();
  await launching?.then((b) => b.close(), () => {});
  await gw?.stop();
  pageServer?.close();
  foreignServer?.close();
  if (secretDir) fs.rmSync(secretDir, { recursive: true, force: true });
});

test('events: a topic message published in the page reaches a subscriber in the page, byte for byte', async () => {
  const dest = `/topic/${unique('browser-ev')}`;
  const r = await page.evaluate(async (url, dest, text) => {
    const [sub, pub] = await Promise.all([connect(url), connect(url)]);
    const inbox = await subscribe(sub, dest);
    await publish(pub, { destination: dest, body: text, headers: { 'content-type': 'text/plain;charset=utf-8', 'x-trace': 'browser-1' } });
    const m = await inbox.next();
    const out = { protocol: sub.webSocket.protocol, version: sub.connectedFrame.headers.version, m };
    await Promise.all([sub.deactivate(), pub.deactivate()]);
    return out;
  }, gw.url, dest, TEXT);
  assert.equal(r.protocol, 'v12.stomp');
  assert.equal(r.version, '1.2');
  assert.equal(r.m.headers.destination, dest);
  assert.deepEqual(r.m.bytes, Array.from(Buffer.from(TEXT, 'utf8')));
  assert.equal(r.m.body, TEXT);
  assert.equal(r.m.headers['content-length'], String(Buffer.byteLength(TEXT)));
  assert.equal(r.m.headers['content-type'], 'text/plain;charset=utf-8');
  assert.equal(r.m.headers['x-trace'], 'browser-1');
  // The page shows what it received; read it back from the DOM.
  const shown = await page.$$eval('#received li', (items, d) => items.filter((li) => li.dataset.destination === d).map((li) => li.textContent), dest);
  assert.deepEqual(shown, [TEXT]);
});

test('events-store: messages stored before the page subscribes are replayed from the first, in order', async () => {
  const dest = `/topic-store/${unique('browser-store')}`;
  const r = await page.evaluate(async (url, dest, text) => {
    const c = await connect(url);
    await publish(c, { destination: dest, body: `one ${text}` });
    await publish(c, { destination: dest, body: `two ${text}` });
    const inbox = await subscribe(c, dest, { 'x-kubemq-start': 'first' });
    const got = [await inbox.next(), await inbox.next()];
    await c.deactivate();
    return got;
  }, gw.url, dest, TEXT);
  assert.deepEqual(r.map((m) => m.bytes), [`one ${TEXT}`, `two ${TEXT}`].map((t) => Array.from(Buffer.from(t, 'utf8'))));
  assert.deepEqual(r.map((m) => m.headers.destination), [dest, dest]);
  assert.deepEqual(r.map((m) => m.headers['x-kubemq-sequence']), ['1', '2']);
  for (const m of r) assert.match(m.headers['x-kubemq-timestamp'], /^[1-9][0-9]*$/);
});

test('queues: a message sent from the page is received with client ack, acknowledged, and not delivered again', async () => {
  const dest = `/queue/${unique('browser-q')}`;
  const r = await page.evaluate(async (url, dest) => {
    const binary = new Uint8Array(256).map((_, i) => i);
    const c = await connect(url);
    await publish(c, { destination: dest, binaryBody: binary, headers: { 'content-type': 'application/octet-stream' } });
    const inbox = await subscribe(c, dest, { ack: 'client' });
    const first = await inbox.next();
    await receipted(c, (receipt) => inbox.message(0).ack({ receipt }));
    await receipted(c, (receipt) => inbox.subscription.unsubscribe({ receipt }));
    await c.deactivate();
    // A new connection and consumer: the acknowledged message is gone, the next one comes.
    const d = await connect(url);
    await publish(d, { destination: dest, body: 'second' });
    const again = await subscribe(d, dest, { ack: 'client' });
    const second = await again.next();
    await receipted(d, (receipt) => again.message(0).ack({ receipt }));
    await d.deactivate();
    return { first, second };
  }, gw.url, dest);
  assert.deepEqual(r.first.bytes, Array.from({ length: 256 }, (_, i) => i));
  assert.equal(r.first.headers['content-type'], 'application/octet-stream');
  assert.equal(r.first.headers.destination, dest);
  assert.ok(r.first.headers.ack, 'a client-ack MESSAGE carries the ack id (STOMP 1.2)');
  assert.equal(r.second.body, 'second');
  assert.equal(r.second.headers.redelivered, undefined);
  // The page shows both deliveries once each (the acknowledged one was not shown again). It
  // renders stompjs's `body`, the UTF-8 decoding of the bytes (invalid ones as U+FFFD), so the
  // binary message reads back as Node's TextDecoder decodes the same 256 bytes.
  const shown = await page.$$eval('#received li', (items, d) => items.filter((li) => li.dataset.destination === d).map((li) => li.textContent), dest);
  assert.deepEqual(shown, [new TextDecoder().decode(new Uint8Array(256).map((_, i) => i)), 'second']);
});

test('commands: the page sends a command and a native gRPC responder answers on its /reply/ subscription', async () => {
  const channel = unique('browser-cmd');
  const svc = responder(SUBSCRIBE_COMMANDS, channel, (request) => ({
    Body: Buffer.concat([Buffer.from('done: '), request.Body]), Executed: true, Tags: { 'x-answered-by': 'node-grpc' },
  }));
  try {
    await svc.ready;
    const r = await page.evaluate(async (url, dest, text) => {
      const c = await connect(url);
      const inbox = await subscribe(c, '/reply/cmd');
      c.publish({ destination: dest, body: text, headers: { 'reply-to': '/reply/cmd', 'correlation-id': 'c-42', timeout: '5000', 'x-order': '42' } });
      const reply = await inbox.next();
      await c.deactivate();
      return reply;
    }, gw.url, `/command/${channel}`, TEXT);
    assert.equal(svc.requests.length, 1);
    assert.deepEqual(svc.requests[0].Body, Buffer.from(TEXT, 'utf8'));
    assert.equal(svc.requests[0].Channel, channel);
    assert.equal(svc.requests[0].Tags['x-order'], '42');
    assert.equal(r.headers.destination, '/reply/cmd');
    assert.equal(r.headers['correlation-id'], 'c-42');
    assert.equal(r.headers['x-kubemq-executed'], 'true');
    assert.equal(r.headers['stomp-error'], undefined);
    assert.equal(r.headers['x-answered-by'], 'node-grpc');
    assert.deepEqual(r.bytes, Array.from(Buffer.from(`done: ${TEXT}`, 'utf8')));
  } finally {
    svc.stop();
  }
});

test('queries: the page sends a query and a native gRPC responder answers with a body and metadata', async () => {
  const channel = unique('browser-query');
  const svc = responder(SUBSCRIBE_QUERIES, channel, (request) => ({
    Body: Buffer.concat([request.Body, Buffer.from(' → 答え')]), Metadata: 'answer-meta', Executed: true,
  }));
  try {
    await svc.ready;
    const r = await page.evaluate(async (url, dest, text) => {
      const c = await connect(url);
      const inbox = await subscribe(c, '/reply/query');
      c.publish({ destination: dest, body: text, headers: { 'reply-to': '/reply/query', 'correlation-id': 'q-7', timeout: '5000' } });
      const reply = await inbox.next();
      await c.deactivate();
      return reply;
    }, gw.url, `/query/${channel}`, TEXT);
    assert.equal(svc.requests.length, 1);
    assert.deepEqual(svc.requests[0].Body, Buffer.from(TEXT, 'utf8'));
    assert.equal(r.headers.destination, '/reply/query');
    assert.equal(r.headers['correlation-id'], 'q-7');
    assert.equal(r.headers['stomp-error'], undefined);
    assert.equal(r.headers['x-kubemq-executed'], undefined, 'a query reply has no executed flag');
    assert.equal(r.headers['x-kubemq-metadata'], 'answer-meta');
    assert.deepEqual(r.bytes, Array.from(Buffer.from(`${TEXT} → 答え`, 'utf8')));
  } finally {
    svc.stop();
  }
});

test('a page from an origin not in --ws-allowed-origins is refused at the handshake and delivers nothing', async () => {
  const dest = `/topic/${unique('browser-origin')}`;
  const foreign = await openPage(foreignServer.origin);
  // The browser logs why the handshake failed; read its log through the DevTools protocol.
  const cdp = await foreign.createCDPSession();
  const log = [];
  cdp.on('Log.entryAdded', ({ entry }) => log.push(entry.text));
  await cdp.send('Log.enable');
  try {
    await page.evaluate(async (url, dest) => {
      window.originTest = { sub: await connect(url) };
      window.originTest.inbox = await subscribe(window.originTest.sub, dest);
    }, gw.url, dest);
    const attempt = await foreign.evaluate((url, dest) => tryWebSocket(url, dest), gw.url, dest);
    assert.equal(attempt.opened, false, 'the WebSocket from another origin opened');
    assert.equal(attempt.code, 1006, 'a refused handshake closes abnormally');
    // stompjs from the other origin does not connect either.
    const stompjs = await foreign.evaluate((url) => connect(url).then(() => 'connected', (e) => e.message), gw.url);
    assert.match(stompjs, /WebSocket closed \(1006\)/);
    // A marker published from the allowed page after the refused attempts is the first message
    // the subscriber gets: nothing came through from the other origin before it.
    const first = await page.evaluate(async (url, dest) => {
      const pub = await connect(url);
      await publish(pub, { destination: dest, body: 'marker' });
      const m = await window.originTest.inbox.next();
      await Promise.all([pub.deactivate(), window.originTest.sub.deactivate()]);
      return m;
    }, gw.url, dest);
    assert.equal(first.body, 'marker');
    assert.ok(log.some((line) => line.includes('403')), `the browser saw the 403; its log: ${JSON.stringify(log)}`);
  } finally {
    await foreign.close();
  }
});

test('authentication: the page is refused without a passcode or with a JWT signed by another key', async () => {
  const r = await page.evaluate(async (url, forged) => {
    const attempt = (headers) => connect(url, headers).then(async (c) => { await c.deactivate(); return 'connected'; }, (e) => e.message);
    return { none: await attempt({ login: 'browser' }), forged: await attempt({ login: 'browser', passcode: forged }) };
  }, gw.url, jwt({ sub: 'mallory', exp: Math.floor(Date.now() / 1000) + 3600 }, 'another secret'));
  assert.equal(r.none, 'STOMP ERROR: access denied');
  assert.equal(r.forged, 'STOMP ERROR: access denied');
});

test('wss: the page reaches the gateway over TLS and a topic message arrives byte for byte', async () => {
  const dest = `/topic/${unique('browser-wss')}`;
  const r = await page.evaluate(async (url, dest, text) => {
    const [sub, pub] = await Promise.all([connect(url), connect(url)]);
    const inbox = await subscribe(sub, dest);
    await publish(pub, { destination: dest, body: text });
    const m = await inbox.next();
    const out = { protocol: sub.webSocket.protocol, url: sub.webSocket.url, m };
    await Promise.all([sub.deactivate(), pub.deactivate()]);
    return out;
  }, wssUrl, dest, TEXT);
  assert.equal(r.url, wssUrl);
  assert.equal(r.protocol, 'v12.stomp');
  assert.equal(r.m.headers.destination, dest);
  assert.deepEqual(r.m.bytes, Array.from(Buffer.from(TEXT, 'utf8')));
});
