// Native KubeMQ gRPC responders (@grpc/grpc-js on KubeMQ's public proto/kubemq.proto) for the
// STOMP RPC tests: a STOMP client is requester-only (a SUBSCRIBE to /command/ or /query/ is
// refused), so the other side of a /command/ or /query/ SEND is a gRPC client of the gateway.
// Shared by stompjs.test.mjs and browser.test.mjs.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));
const PROTO = path.join(here, '..', '..', 'proto', 'kubemq.proto');
// Subscribe.SubscribeType of the proto.
export const SUBSCRIBE_COMMANDS = 3;
export const SUBSCRIBE_QUERIES = 4;

/** A gRPC client of the gateway's KubeMQ API at `addr` (host:port, plaintext). */
export function kubemqClient(addr) {
  const { kubemq: pkg } = grpc.loadPackageDefinition(protoLoader.loadSync(PROTO, { keepCase: true, longs: String, enums: Number, defaults: true }));
  return new pkg.kubemq(addr, grpc.credentials.createInsecure());
}

/** A native responder on `channel`: answers each request with `answer(request)`, or not at all
 * when that returns null (a responder that never answers, for timeouts); `ready` resolves once
 * the gateway has registered it (its response headers come after that). `auth` is the calls'
 * metadata (a JWT when the gateway requires one). */
export function responder(client, type, channel, answer, auth = new grpc.Metadata()) {
  const requests = [];
  const call = client.SubscribeToRequests({ SubscribeTypeData: type, ClientID: 'node-responder', Channel: channel }, auth);
  const ready = new Promise((resolve, reject) => {
    call.once('metadata', resolve);
    call.once('error', reject);
  });
  call.on('data', (request) => {
    requests.push(request);
    const answered = answer(request);
    if (!answered) return;
    const response = { ClientID: 'node-responder', RequestID: request.RequestID, ReplyChannel: request.ReplyChannel, ...answered };
    client.SendResponse(response, auth, (err) => { if (err) console.error(`SendResponse: ${err.message}`); });
  });
  call.on('error', () => {}); // the CANCELLED of stop()
  return { ready, requests, stop: () => call.cancel() };
}
