// What the coordinator sends one agent on its DEALER (agent-bus.ts keeps the wave stream's sync):
// the proof of the bus token for a connection, the snapshot reply to the ask in flight, a refusal
// (another protocol version), and the file and column requests it relays (agent-file-requests.ts).
// Anything on a connection replaced since, or not proven yet, is dropped and counted.
import type { BusToken } from './auth';
import type { RequestHandler, SnapshotReplyMsg } from './agent-bus-types';
import { answerFileRequest } from './agent-file-requests';
import type { CoordinatorLink } from './coordinator-link';
import { decodeCoordinatorMessage, type DropCounter } from './frames';
import { PROTOCOL_VERSION, versionMismatch } from './protocol-version';

/** The agent bus as its DEALER's messages need it. */
export interface DealerHost {
  readonly rank: number;
  readonly maxFrameBytes: number;
  readonly token?: BusToken;
  readonly drops: DropCounter;
  link(): CoordinatorLink | undefined;
  handler(): RequestHandler | undefined;
  /** Whether `requestId` is the snapshot ask this agent waits on now. */
  awaitsSnapshot(requestId: number): boolean;
  refused(): boolean;
  applySnapshot(snap: SnapshotReplyMsg): void;
  refuse(epoch: number, error: string): void;
  send(body: Record<string, unknown>, requestId: number): void;
}

export function onCoordinatorMessage(h: DealerHost, parts: Buffer[], generation: number): void {
  if (parts.length !== 1) return h.drops.drop('frame_count', `${parts.length} frames from the coordinator`);
  const d = decodeCoordinatorMessage(parts[0], h.maxFrameBytes, h.token);
  if (!d.ok) return h.drops.drop(d.reason, d.detail);
  const msg = d.value;
  const link = h.link();
  if (msg.body === 'proof') {
    if (!link?.proof(msg.proof.nonce, generation)) h.drops.drop('stale_proof', 'a proof for another connection or nonce');
    return;
  }
  // A message on a connection replaced since (or not proven yet): never acted on.
  if (!link?.current(generation)) return h.drops.drop('old_connection', `a ${msg.body} message on a replaced connection`);
  switch (msg.body) {
    case 'snapshot':
      if (!h.awaitsSnapshot(msg.requestId)) return; // an answer to an older ask
      if (Number(msg.snapshot.protocolVersion ?? 0) !== PROTOCOL_VERSION) {
        h.refuse(msg.epoch, versionMismatch('coordinator', Number(msg.snapshot.protocolVersion ?? 0), `agent (rank ${h.rank})`, PROTOCOL_VERSION));
        return;
      }
      h.applySnapshot(msg.snapshot as SnapshotReplyMsg);
      return;
    case 'refused':
      if (!h.refused()) h.refuse(msg.epoch, msg.refused.error || versionMismatch(`agent (rank ${h.rank})`, PROTOCOL_VERSION, 'coordinator', msg.refused.protocolVersion));
      return;
    case 'fileList':
    case 'fileChunk':
    case 'fileServe':
    case 'replay':
    case 'decidedColumn':
      answerFileRequest(h.handler(), msg, h.rank, (body, requestId) => h.send(body, requestId));
      return;
    default:
      return; // heartbeat / status: nothing to do
  }
}
