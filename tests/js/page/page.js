// Runs in the browser page of tests/js/browser.test.mjs: small helpers over @stomp/stompjs
// (the global `StompJs` of its UMD bundle) that the test calls through page.evaluate. Every
// wait is bounded, and receipts are the barriers (a subscription is in place once its RECEIPT
// is in).
'use strict';

const WAIT_MS = 5000;
let sequence = 0;
const unique = (prefix) => `${prefix}-${Date.now()}-${sequence++}`;

function within(promise, what) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: nothing within ${WAIT_MS} ms`)), WAIT_MS);
    promise.then((v) => { clearTimeout(timer); resolve(v); }, (e) => { clearTimeout(timer); reject(e); });
  });
}

/** A connected client (stompjs offers v12.stomp, v11.stomp, v10.stomp by default). The test
 * sets `window.defaultConnectHeaders` (login and a JWT passcode) when it loads the page. */
window.connect = (url, connectHeaders = window.defaultConnectHeaders || {}) => within(new Promise((resolve, reject) => {
  const client = new StompJs.Client({
    brokerURL: url,
    connectHeaders,
    reconnectDelay: 0,
    heartbeatIncoming: 0,
    heartbeatOutgoing: 0,
    onConnect: (frame) => { client.connectedFrame = frame; resolve(client); },
    onStompError: (frame) => reject(new Error(`STOMP ERROR: ${frame.headers.message}`)),
    onWebSocketClose: (event) => reject(new Error(`WebSocket closed (${event.code})`)),
  });
  client.activate();
}), `CONNECTED from ${url}`);

/** Runs `send(receiptId)` and resolves once the gateway's RECEIPT for it is in. */
window.receipted = (client, send) => {
  const receipt = unique('receipt');
  const done = new Promise((resolve) => client.watchForReceipt(receipt, resolve));
  send(receipt);
  return within(done, `RECEIPT ${receipt}`);
};

/** SEND with a receipt: resolves once the gateway has taken the message. */
window.publish = (client, params) => window.receipted(client, (receipt) => client.publish({
  ...params, headers: { ...(params.headers || {}), receipt },
}));

/** A message as plain data the test can read: headers, body text, body bytes. */
function plain(message) {
  return { headers: { ...message.headers }, body: message.body, bytes: Array.from(message.binaryBody) };
}

/** Shows a received message in the page, where the test reads it back from the DOM. */
function show(message) {
  const item = document.createElement('li');
  item.dataset.destination = message.headers.destination;
  item.textContent = message.body;
  document.getElementById('received').appendChild(item);
}

/** SUBSCRIBE confirmed by a RECEIPT; `next()` resolves with the next message (plain data);
 * `message(i)` is the stompjs message itself, for ACK. */
window.subscribe = async (client, destination, headers = {}) => {
  const queue = [];
  const waiting = [];
  const raw = [];
  const onMessage = (message) => {
    raw.push(message);
    show(message);
    const p = plain(message);
    if (waiting.length) waiting.shift()(p); else queue.push(p);
  };
  let subscription;
  await window.receipted(client, (receipt) => {
    subscription = client.subscribe(destination, onMessage, { ...headers, receipt });
  });
  return {
    subscription,
    message: (i) => raw[i],
    next: () => within(queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiting.push(r)), `a message on ${destination}`),
  };
};

/** UTF-8 bytes of a string, to compare with what arrived. */
window.utf8 = (text) => Array.from(new TextEncoder().encode(text));

/** A bare WebSocket attempt: resolves with how it ended. If it opens, it also tries CONNECT
 * and a SEND to `destination` (so a wrongly accepted handshake would deliver something). */
window.tryWebSocket = (url, destination) => within(new Promise((resolve) => {
  const ws = new WebSocket(url, ['v12.stomp', 'v11.stomp', 'v10.stomp']);
  let opened = false;
  ws.onopen = () => {
    opened = true;
    ws.send('CONNECT\naccept-version:1.2\nhost:/\n\n\0');
    ws.send(`SEND\ndestination:${destination}\n\nfrom another origin\0`);
    resolve({ opened, code: null });
  };
  ws.onerror = () => {};
  ws.onclose = (event) => resolve({ opened, code: event.code });
}), `the WebSocket to ${url} to end`);
