// A small STOMP 1.2 client over a plain TCP socket (node:net), for tests that need exact control
// of headers and body bytes: frames are parsed by content-length, headers escaped as 1.2 says.
import net from 'node:net';

const WAIT_MS = 5000;
let receipts = 0;

const escape = (s) => String(s).replace(/\\/g, '\\\\').replace(/\r/g, '\\r').replace(/\n/g, '\\n').replace(/:/g, '\\c');
const unescape = (s) => s.replace(/\\(.)/g, (_, c) => ({ n: '\n', r: '\r', c: ':', '\\': '\\' })[c] ?? `\\${c}`);

/** One frame as bytes; `body` is a Buffer or a string (UTF-8). */
function encode(command, headers, body) {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body ?? '');
  const lines = [command];
  for (const [k, v] of Object.entries(headers)) lines.push(`${escape(k)}:${escape(v)}`);
  if (command === 'SEND') lines.push(`content-length:${bytes.length}`);
  return Buffer.concat([Buffer.from(`${lines.join('\n')}\n\n`), bytes, Buffer.from([0])]);
}

/** Takes one whole frame off the front of `buf`: `{ frame, rest }`, or null if it is not whole. */
function decode(buf) {
  let start = 0;
  while (start < buf.length && (buf[start] === 0x0a || buf[start] === 0x0d)) start += 1; // heart-beats
  const end = buf.indexOf('\n\n', start);
  if (end < 0) return null;
  const [command, ...lines] = buf.subarray(start, end).toString('utf8').split('\n').map((l) => l.replace(/\r$/, ''));
  const headers = {};
  for (const line of lines) {
    const i = line.indexOf(':');
    const name = unescape(line.slice(0, i));
    if (!(name in headers)) headers[name] = unescape(line.slice(i + 1)); // first occurrence wins
  }
  const bodyStart = end + 2;
  const length = headers['content-length'] !== undefined ? Number(headers['content-length']) : buf.indexOf(0, bodyStart) - bodyStart;
  if (length < 0 || buf.length < bodyStart + length + 1) return null;
  return { frame: { command, headers, body: buf.subarray(bodyStart, bodyStart + length) }, rest: buf.subarray(bodyStart + length + 1) };
}

export class StompTcp {
  constructor(socket) {
    this.socket = socket;
    this.frames = [];
    this.waiters = [];
    this.closed = false;
    let buf = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      for (let d = decode(buf); d; d = decode(buf)) {
        buf = d.rest;
        this.frames.push(d.frame);
        this.wake();
      }
    });
    socket.on('close', () => { this.closed = true; this.wake(); });
    socket.on('error', () => {});
  }

  /** Connects with STOMP 1.2 and resolves once CONNECTED arrived. */
  static async connect(port) {
    const socket = net.connect(port, '127.0.0.1');
    await new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); });
    const c = new StompTcp(socket);
    c.write('CONNECT', { 'accept-version': '1.2', host: '/' });
    const f = await c.next((fr) => fr.command === 'CONNECTED' || fr.command === 'ERROR');
    if (f.command !== 'CONNECTED') throw new Error(`CONNECT refused: ${f.headers.message}`);
    return c;
  }

  wake() {
    for (const w of [...this.waiters]) w();
  }

  write(command, headers = {}, body = undefined) {
    this.socket.write(encode(command, headers, body));
  }

  /** The first frame (received so far or later) that `match` accepts, removed from the inbox. */
  next(match = () => true, ms = WAIT_MS) {
    return new Promise((resolve, reject) => {
      const check = () => {
        const i = this.frames.findIndex(match);
        if (i >= 0) {
          done();
          resolve(this.frames.splice(i, 1)[0]);
        } else if (this.closed) {
          done();
          reject(new Error(`connection closed; frames left: ${JSON.stringify(this.frames.map((f) => f.headers))}`));
        }
      };
      const timer = setTimeout(() => { done(); reject(new Error(`no matching frame within ${ms} ms`)); }, ms);
      const done = () => { clearTimeout(timer); this.waiters = this.waiters.filter((w) => w !== check); };
      this.waiters.push(check);
      check();
    });
  }

  /** The next MESSAGE of subscription `id`. */
  message(id, ms = WAIT_MS) {
    return this.next((f) => f.command === 'MESSAGE' && f.headers.subscription === id, ms);
  }

  /** Sends a frame with a receipt and resolves once its RECEIPT came back (rejects on ERROR). */
  async receipted(command, headers = {}, body = undefined) {
    const receipt = `r-${process.pid}-${receipts++}`;
    this.write(command, { ...headers, receipt }, body);
    const f = await this.next((fr) => (fr.command === 'RECEIPT' && fr.headers['receipt-id'] === receipt) || fr.command === 'ERROR');
    if (f.command === 'ERROR') throw new Error(`${command} answered ERROR: ${f.headers.message}: ${f.body}`);
    return f;
  }

  subscribe(id, destination, headers = {}) {
    return this.receipted('SUBSCRIBE', { id, destination, ack: 'auto', ...headers });
  }

  close() {
    this.socket.destroy();
  }
}
