// What an agent tells the coordinator about its rank, as the coordinator's ROUTER path takes it
// (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md): a frame opened and admitted as the ROUTER loop
// does (router-inbox.ts, drop reasons counted), then the body's own handling: EngineCrash into the
// book /healthz lists (src/bus/engine-crashes.ts), Fingerprint cut to local limits
// (src/guard/fingerprint.ts). The socket itself, with these bodies among the others, is
// bench/fuzz.ts's coordinator target (bench/lib/fuzz-coordinator.ts).
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { EngineCrashes } from '../../src/bus/engine-crashes';
import { DropCounter, encodeAgentMessage } from '../../src/bus/frames';
import { VersionGate } from '../../src/bus/protocol-version';
import { admitRouterMessage, openRouterMessage } from '../../src/bus/router-inbox';
import { ColumnScratch } from '../../src/client/telemetry';
import { looksSecret } from '../../src/client/fingerprint';
import { LIMITS, sanitizeFingerprint } from '../../src/guard/fingerprint';
import type { Outcome, Surface, SurfaceRun } from '../fuzz-surfaces';

const WORLD = 2;

/** Feed frames through the ROUTER's open and admission, then `handle` the body it is about; other bodies are another surface's input. */
function routerSurface(name: string, from: string, body: string, valid: Array<Record<string, unknown>>, craft: (m: Mutator) => Record<string, unknown>, handle: (rank: number, msg: Record<string, any>) => string): Surface {
  return {
    name,
    from,
    async open(): Promise<SurfaceRun> {
      let dropped: string | undefined;
      const drops = new DropCounter(undefined, 'fuzz', (reason) => (dropped = reason));
      let refused = false;
      const admission = { drops, versions: new VersionGate(), worldSize: WORLD, reply: (_r: Buffer, msg: Record<string, unknown>) => void (refused = Boolean(msg.refused)) };
      const scratch = new ColumnScratch();
      let conn = 0;
      const feed = (input: Buffer): Outcome => {
        dropped = undefined;
        refused = false;
        const routingId = Buffer.alloc(5);
        routingId.writeUInt32BE(++conn, 1);
        const opened = openRouterMessage([routingId, input], DEFAULT_MAX_FRAME_BYTES, undefined, scratch, drops);
        const rank = opened && admitRouterMessage(opened, admission);
        if (opened && rank !== undefined) return opened.msg.body === body ? { accepted: handle(rank, opened.msg as Record<string, any>) } : { accepted: `other_body:${opened.msg.body}` };
        if (refused) return { refused: `refused:${dropped}` };
        if (dropped === undefined) throw new Error('a frame neither taken nor counted as dropped');
        return { refused: `drop:${dropped}` };
      };
      const encoded = valid.map((v) => encodeAgentMessage(v));
      return {
        valid: encoded,
        craft: (m) => encodeAgentMessage(craft(m)),
        feed,
        alive() {
          const o = feed(encoded[0]);
          if (!('accepted' in o) || o.accepted.startsWith('other_body')) throw new Error(`a valid ${body} afterwards: ${JSON.stringify(o)}`);
        },
        close() {},
      };
    },
  };
}

const edgeNat = (m: Mutator) => m.pick([0, 1, 2, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 53 - 1, 2 ** 53 + 2, 2 ** 64 - 1]);
const edgeStr = (m: Mutator) => m.pick(['', 'SIGKILL', 'x'.repeat(257), 'ž'.repeat(300), '\u0000', '../../etc', '<script>']);

const crashes = new EngineCrashes();
const within = (v: unknown) => v === null || (typeof v === 'number' && Number.isSafeInteger(v)) || (typeof v === 'string' && v.length <= 256);

export const engineCrashSurface = routerSurface(
  'engine_crash',
  'the coordinator ROUTER: an agent says its engine died (AgentMessage.engine_crash), kept for /healthz',
  'engineCrash',
  [
    { globalRank: 1, engineCrash: { enginePid: 4242, exitKnown: true, signal: 'SIGKILL', lastWave: 17, forwardsFlushed: 4, flushDir: '/tmp/run/recorder/crash-1', note: 'RuntimeError' } },
    { globalRank: 0, engineCrash: { enginePid: 7, exitKnown: true, exitCode: -3, lastWave: 0 } },
  ],
  (m) => ({ globalRank: m.pick([0, 1, 2, 2 ** 32 - 1]), engineCrash: { enginePid: edgeNat(m) >>> 0, exitKnown: m.rand() < 0.5, exitCode: m.pick([0, -1, 2 ** 31 - 1, -(2 ** 31)]), signal: edgeStr(m), lastWave: edgeNat(m), forwardsFlushed: edgeNat(m) >>> 0, flushDir: edgeStr(m), note: edgeStr(m) } }),
  (rank, msg) => {
    crashes.record(rank, msg.engineCrash ?? {});
    const kept = crashes.status();
    const last = kept[kept.length - 1] as unknown as Record<string, unknown>;
    // What /healthz shows: every field bounded and of its type, whatever came in.
    for (const [k, v] of Object.entries(last)) if (!within(v)) throw new Error(`engine crash field ${k} kept unbounded: ${String(v).slice(0, 80)}`);
    if (kept.length > 32) throw new Error('the crash book grows without bound');
    return last.signal ? 'engine_crash:signal' : last.exit_code !== null ? 'engine_crash:exit_code' : 'engine_crash:unknown_exit';
  },
);

export const fingerprintSurface = routerSurface(
  'fingerprint',
  'the coordinator ROUTER: a rank\'s fingerprint (AgentMessage.fingerprint), cut to local limits before it is kept',
  'fingerprint',
  [
    { globalRank: 0, fingerprint: { wavebusVersion: '0.1.0', language: 'python', torchVersion: '2.4.0', env: [{ name: 'NCCL_ALGO', value: 'Ring' }, { name: 'NCCL_X_TOKEN', redacted: true }], weights: [{ name: 'w', checksum: 'crc32c:0123abcd', bytes: 4, dtype: 'float32' }] } },
    { globalRank: 1, fingerprint: { wavebusVersion: '0.1.0' } },
  ],
  (m) => ({
    globalRank: m.pick([0, 1, 5]),
    fingerprint: {
      wavebusVersion: edgeStr(m), deviceName: edgeStr(m),
      env: Array.from({ length: m.pick([0, 1, 600]) }, (_, i) => ({ name: m.pick(['NCCL_ALGO', 'CUDA_VISIBLE_DEVICES', `NCCL_${i}_SECRET`, '1BAD', 'x'.repeat(200), 'PATH']), value: edgeStr(m), redacted: m.rand() < 0.2 })),
      weights: Array.from({ length: m.pick([0, 2, 100]) }, (_, i) => ({ name: m.pick([`w${i}`, '', 'w'.repeat(600)]), checksum: m.pick(['crc32c:0123abcd', 'crc32c:XYZ', '']), bytes: edgeNat(m), dtype: edgeStr(m) })),
    },
  }),
  (_rank, msg) => {
    const fp = sanitizeFingerprint(msg.fingerprint);
    if (fp.env.length > LIMITS.env || fp.weights.length > LIMITS.weights) throw new Error('a fingerprint kept past its limits');
    for (const e of fp.env) if (e.value.length > LIMITS.envValue || (e.redacted && e.value !== '') || (looksSecret(e.name) && !e.redacted)) throw new Error(`env ${e.name} kept unredacted or unbounded`);
    for (const w of fp.weights) if (w.name.length > LIMITS.weightName || !Number.isSafeInteger(w.bytes)) throw new Error(`weight ${w.name.slice(0, 40)} kept unbounded`);
    return fp.env.length + fp.weights.length > 0 ? 'fingerprint:kept_entries' : 'fingerprint:versions_only';
  },
);
