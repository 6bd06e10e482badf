// A verdict's replay request as an agent takes it (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md):
// a CoordinatorMessage frame decoded as the agent's DEALER does (decodeCoordinatorMessage), then
// ReplayServer.handle (src/agent/replay-server.ts) with a real snapshot root: every field checked,
// the files staged under the root, the child run, the folder removed. The child here is a named
// stand-in for `wavebus verdict --replay-request` (a shell that prints one replay result), so each
// accepted input costs a process start, not a torch replay; the real child runs in
// test/verdict.test.ts and test/verdict-netns.test.ts.
import * as fs from 'fs';
import * as path from 'path';
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { decodeCoordinatorMessage, encodeCoordinatorMessage } from '../../src/bus/frames';
import { createLogger } from '../../src/log';
import { ReplayServer } from '../../src/agent/replay-server';
import type { Outcome, Surface, SurfaceRun } from '../fuzz-surfaces';

/** The stand-in replay: one output within tolerance. */
const STAND_IN = ['/bin/sh', '-c', `printf '%s' '{"ok":true,"tensors":[{"call":3,"rank":0,"shape":[1,8],"dtype":"float32","atol":1e-5,"rtol":1e-4,"max_abs_diff":0,"mismatched":0,"numel":8,"bit_exact":true,"within_tolerance":true},{"call":4,"rank":1,"shape":[1,9],"dtype":"float32","atol":1e-5,"rtol":1e-4,"max_abs_diff":"inf","mismatched":9,"numel":9,"bit_exact":false,"within_tolerance":false}],"fingerprint":[{"index":0,"kind":"cpu"}]}'`, 'replay-stand-in'];

const file = (p: string, n = 16) => ({ path: p, data: Buffer.alloc(n, 7) });
const VALID = [
  { epoch: 1, requestId: 5, replay: { incident: 'incident-wave9-dp0', calls: [3, 4], ranks: [0, 1], devices: [0, 1], ranksOnDevices: [2, 3], allowLiveDevice: true, timeoutMs: 60000, tolerances: ['fp32=1e-5,1e-4'],
    files: [file('snapshots/rank0/call3/meta.json'), file('snapshots/rank0/call3/tensor0.npy', 200), file('snapshots/rank1/call4/tensor0.npy'), file('engine/forward_rank1_step6.pt', 100)] } },
  { epoch: 2, requestId: 6, replay: { incident: 'crash-17', calls: [0], ranks: [4], devices: [7], files: [file('snapshots/rank4/call0/tensor1.npy', 0)] } },
];

const PATHS = ['snapshots/rank0/call3/meta.json', 'snapshots/rank0/call3/../../x', '../x', '/etc/passwd', 'snapshots/rank01/call3/a', 'snapshots/rank0/call3/.hidden', 'engine/forward_rank1_step6.pt', 'engine/x.pt', 'snapshots/rank9/call3/a', '', 'snapshots/rank0/call3/' + 'a'.repeat(200)];

function craft(m: Mutator): Record<string, unknown> {
  const n = m.pick([0, 1, 2, 3, 5]);
  return {
    epoch: 1, requestId: m.pick([0, 1, 2 ** 32]),
    replay: {
      incident: m.pick(['incident-wave9-dp0', '', '../up', 'x'.repeat(200), 'crash-1']),
      calls: Array.from({ length: m.pick([0, 1, 2, 5000]) }, () => m.pick([0, 3, 4, 2 ** 32 - 1])),
      ranks: Array.from({ length: m.pick([0, 1, 2, 65]) }, () => m.pick([0, 1, 9])),
      devices: Array.from({ length: m.pick([0, 1, 2]) }, () => m.pick([0, 1, 65535, 70000])),
      ranksOnDevices: [m.pick([0, 2])],
      allowLiveDevice: m.rand() < 0.5,
      timeoutMs: m.pick([0, 1, 600000, 600001, 2 ** 32 - 1]),
      tolerances: Array.from({ length: m.pick([0, 1, 9]) }, () => m.pick(['fp32=1e-5,1e-4', 'bf16=x,y', '', 'fp32=1,2;rm -rf'])),
      files: Array.from({ length: n }, () => ({ path: m.pick(PATHS), data: Buffer.alloc(m.pick([0, 1, 64])) })),
    },
  };
}

export const replayRequestSurface: Surface = {
  name: 'replay_request',
  from: "an agent's DEALER: a verdict's replay relayed by the coordinator (CoordinatorMessage.replay), staged under the snapshot root",
  async open(dir: string): Promise<SurfaceRun> {
    const root = path.join(dir, 'snapshots');
    fs.mkdirSync(root, { mode: 0o700 });
    const server = new ReplayServer({ globalRank: 0, root, args: [], log: createLogger('fuzz-replay', 'silent'), cli: STAND_IN });
    const feed = async (input: Buffer): Promise<Outcome> => {
      const d = decodeCoordinatorMessage(input, DEFAULT_MAX_FRAME_BYTES);
      if (!d.ok) return { refused: `drop:${d.reason}` };
      if (d.value.body !== 'replay') return { accepted: `other_body:${d.value.body}` };
      const r = (await server.handle(d.value)).replay as Record<string, any>;
      const left = fs.readdirSync(root);
      if (left.length) throw new Error(`staging left behind: ${left.join(', ')}`);
      if (!r.error) return { accepted: 'replayed' };
      const m = /^refused: (\w+)/.exec(r.error);
      // Anything but a named refusal is a failure of the agent's own handling.
      if (!m) throw new Error(`a request neither refused by field nor replayed: ${r.error}`);
      return { refused: `refused:${m[1]}`, detail: r.error };
    };
    const valid = VALID.map((v) => encodeCoordinatorMessage(v));
    return {
      valid,
      craft: (m) => encodeCoordinatorMessage(craft(m)),
      feed,
      async alive() {
        const o = await feed(valid[0]);
        if (!('accepted' in o) || o.accepted !== 'replayed') throw new Error(`a valid replay request afterwards: ${JSON.stringify(o)}`);
        // The answer keeps each tensor's error: a shape mismatch's infinite difference stays infinite.
        const d = decodeCoordinatorMessage(valid[0], DEFAULT_MAX_FRAME_BYTES);
        if (!d.ok) throw new Error(`the valid request does not decode: ${d.reason}`);
        const r = (await server.handle(d.value)).replay as Record<string, any>;
        const diffs = (r.tensors as Record<string, any>[]).map((t) => [t.call, t.rank, t.maxAbsDiff, t.withinTolerance]);
        if (JSON.stringify(diffs) !== JSON.stringify([[3, 0, 0, true], [4, 1, null, false]]) || diffs[1][2] !== Infinity) throw new Error(`the replay's tensors as answered: ${JSON.stringify(diffs)}`);
      },
      close: () => server.stop(),
    };
  },
};
