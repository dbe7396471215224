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

function listening(port, deadline) {
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

/** A running gateway: `url` is its ws:// address; `stop()` ends it. */
export async function startGateway(extraArgs = []) {
  const [stompPort, wsPort] = [await freePort(), await freePort()];
  const args = ['--cores', '1', '--grpc-addr', 'off', '--stomp-addr', `127.0.0.1:${stompPort}`,
    '--ws-addr', `127.0.0.1:${wsPort}`, ...extraArgs];
  const child = spawn(BIN, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  await Promise.race([
    listening(wsPort, Date.now() + 20000),
    exited.then((code) => { throw new Error(`stompgate exited (${code}): ${stderr}`); }),
  ]);
  return {
    url: `ws://127.0.0.1:${wsPort}/ws`,
    wsPort,
    stderr: () => stderr,
    stop: async () => { child.kill('SIGTERM'); await exited; },
  };
}
