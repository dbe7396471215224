// Starts the built stompgate (STOMPGATE_BIN, default target/release/stompgate of this tree) as
// a child process on free loopback ports, with its WebSocket listener on, and stops it.
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const BIN = process.env.STOMPGATE_BIN || path.join(here, '..', '..', 'target', 'release', 'stompgate');

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Resolves once 127.0.0.1:`port` accepts a connection; rejects past `deadline` (ms since the epoch). */
export function listening(port, deadline) {
  return new Promise((resolve, reject) => {
    const attempt = () => {
      const sock = net.connect(port, '127.0.0.1');
      sock.once('connect', () => { sock.destroy(); resolve(); });
      sock.once('error', () => {
        sock.destroy();
        if (Date.now() > deadline) reject(new Error(`stompgate did not listen on ${port}`));
        else setTimeout(attempt, 50);
      });
    };
    attempt();
  });
}

/** A free TCP port on 127.0.0.1 (for a listener the test starts itself). */
export { freePort };

/** A running gateway: `url` is its ws:// address, `stompPort` its STOMP TCP port; `stop()` ends it. With `{ grpc: true }` its
 * KubeMQ gRPC API listens too, at `grpcAddr` (the RPC responders of the tests live there); with `{ amqp: true }` its AMQP 1.0
 * listener, at `amqpPort`. */
export async function startGateway(extraArgs = [], { grpc = false, amqp = false } = {}) {
  const [stompPort, wsPort, grpcPort, amqpPort] = [await freePort(), await freePort(), grpc ? await freePort() : 0, amqp ? await freePort() : 0];
  // In memory (`--store-dir off`): the default ./store would be one lock for every gateway.
  const args = ['--cores', '1', '--store-dir', 'off', '--grpc-addr', grpc ? `127.0.0.1:${grpcPort}` : 'off',
    '--amqp-addr', amqp ? `127.0.0.1:${amqpPort}` : 'off', '--stomp-addr', `127.0.0.1:${stompPort}`, '--ws-addr', `127.0.0.1:${wsPort}`, ...extraArgs];
  const child = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const deadline = Date.now() + 20000;
  await Promise.race([
    Promise.all([listening(wsPort, deadline), amqp ? listening(amqpPort, deadline) : null]),
    exited.then((code) => { throw new Error(`stompgate exited (${code}): ${stderr}`); }),
  ]);
  return {
    url: `ws://127.0.0.1:${wsPort}/ws`,
    wsPort,
    stompPort,
    amqpPort: amqp ? amqpPort : null,
    grpcAddr: grpc ? `127.0.0.1:${grpcPort}` : null,
    stderr: () => stderr,
    stop: async () => { child.kill('SIGTERM'); await exited; },
  };
}
