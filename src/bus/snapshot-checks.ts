// Whether an agent can follow a coordinator's snapshot (agent-bus.ts applies the ones it can): one
// of another replica or with a decide_ahead this layout cannot have is a coordinator of another
// layout (or a bug), dropped as such and asked for again later.
import { validDecideAhead } from './constants';
import type { DropReason } from './frames';
import type { SnapshotReplyMsg } from './agent-bus-types';

/** Why `snap` is not for this agent (replica `replica`, `pp` stages), or undefined when it is. */
export function snapshotMismatch(snap: SnapshotReplyMsg, replica: number, pp: number): { reason: DropReason; detail: string } | undefined {
  // The coordinator derives the replica from our rank; another one means a layout mismatch.
  if (Number(snap.replica ?? 0) !== replica) return { reason: 'wrong_topic', detail: `a snapshot of replica ${snap.replica} for replica ${replica}` };
  // How far ahead the stream decides sets the wave every rank copies and switches at.
  if (!validDecideAhead(snap.decideAhead, pp)) return { reason: 'bad_snapshot', detail: `decide_ahead ${snap.decideAhead} for pp=${pp}` };
  return undefined;
}
