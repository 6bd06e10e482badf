// The control requests a coordinator answers and the status document `wavebus status` draws
// (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md), in process.
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { DEFAULT_MAX_FRAME_BYTES } from '../../src/bus/constants';
import { Coordinator } from '../../src/bus/coordinator';
import { DropCounter, encodeAgentMessage } from '../../src/bus/frames';
import { PROTOCOL_VERSION, VersionGate } from '../../src/bus/protocol-version';
import { admitRouterMessage, openRouterMessage } from '../../src/bus/router-inbox';
import { ColumnScratch } from '../../src/client/telemetry';
import { Guard } from '../../src/guard/guard';
import { parseStartupOptions } from '../../src/guard/startup';
import { createLogger } from '../../src/log';
import { renderStatus } from '../../src/tools/status-table';
import type { WorldLayout } from '../../src/layout';
import { mutateJson, type Outcome, type Surface } from '../fuzz-surfaces';

// ---------------------------------------------------------------- control requests

const quiet = createLogger('fuzz-surfaces', 'silent');

/** Valid control requests of every kind, as `wavebus status / dump / capture` sends them. */
export function controlCorpus(): Buffer[] {
  const v = PROTOCOL_VERSION;
  return [
    { status: {} },
    { dump: { all: true } },
    { dump: { requestId: 'req-3', hasReplica: true, replica: 0 } },
    { capture: { requestIds: ['req-1', 'req-2'], format: 1, maxCaptures: 2 } },
    { capture: { tokenTargets: [25], tpRanks: [0, 1], withinWaves: 100 } },
    { capture: { next: true, format: 2 } },
    { capture: { callIndices: [3, 4], hasReplica: true, replica: 0 } },
    { query: { id: 'capture-1' } },
    { query: { id: 'dump-1' } },
    // `wavebus verdict --coordinator`'s note (docs/verdict.md), as it sends one per incident judged
    { verdict: { incident: 'incident-wave12', verdict: 'device-local', host: 'node-1', devices: [0], replica: 0, ranks: [0, 1], reason: 'rank 1 alone diverged on its device', fingerprint: 'node-1 cpu torch 2.13' } },
    { verdict: { incident: 'crash-run7', verdict: 'deterministic', host: 'h', ranks: [1], bisectModule: 'model.layers.1.mlp.up_proj' } },
  ].map((body, i) => encodeAgentMessage({ requestId: 10 + i, control: { protocolVersion: v, ...body } }));
}

/** A TP=2 coordinator with the runtime guard, not started (its control answers need no socket); what it logs as errors is kept. */
function guardedCoordinator(dir: string): { c: Coordinator; layout: WorldLayout; failures: string[] } {
  const layout = { worldSize: 2, tp: 2, pp: 1, dp: 1, cp: 1 };
  const startup = parseStartupOptions(JSON.stringify({ runtime_config: {} }), {}, dir);
  const guard = new Guard({ startup, layout, log: quiet });
  const log = createLogger('fuzz-coordinator', 'silent');
  const failures: string[] = [];
  log.error = ((o: unknown, msg?: string) => void failures.push(`${msg}: ${JSON.stringify(o).slice(0, 400)}`)) as typeof log.error;
  return { c: new Coordinator({ port: 1, layout, policy: guard, logger: log }), layout, failures };
}

/** A control request of a random kind with values drawn from the edges of each field's range. */
function craftControl(m: Mutator): Record<string, unknown> {
  const nat = () => m.pick([0, 1, 2, 3, 7, 64, 65, 1000, 1001, 2 ** 31, 2 ** 32 - 1, 2 ** 53 - 1]);
  const str = () => m.pick(['', ' ', 'req-1', 'capture-1', 'dump-1', 'x'.repeat(256), 'x'.repeat(257), '\u0000', 'ž'.repeat(300)]);
  const list = <T>(f: () => T) => Array.from({ length: m.pick([0, 1, 2, 64, 65, 200]) }, f);
  const replica = m.rand() < 0.5 ? { hasReplica: true, replica: nat() } : {};
  // format is an enum: other numbers do not encode (the byte mutations make them).
  const body = m.pick([
    () => ({ status: {} }),
    () => ({ dump: { requestId: m.rand() < 0.5 ? str() : '', all: m.rand() < 0.5, ...replica } }),
    () => ({ capture: { requestIds: list(str), tokenTargets: list(nat), callIndices: list(nat), next: m.rand() < 0.3, tpRanks: list(nat), format: m.pick([0, 1, 2, 3]), maxCaptures: nat(), withinWaves: nat(), flushRecorder: m.rand() < 0.1, ...replica } }),
    () => ({ query: { id: str() } }),
    () => ({ verdict: { incident: m.pick(['incident-wave3', 'incident-wave3-dp1', 'crash-x', 'flush-capture-2', 'incident-wave', '../x', str()]), verdict: m.pick(['deterministic', 'device-local', 'transient', 'inconclusive', str()]), host: m.pick(['h', 'node-1', '-x', 'a'.repeat(64), 'a'.repeat(65), str()]), devices: list(nat), replica: nat(), ranks: list(nat), reason: str(), bisectModule: m.pick(['', 'model.layers.1', 'a b', str()]), fingerprint: str() } }),
    () => ({}),
  ])();
  return { protocolVersion: m.rand() < 0.95 ? PROTOCOL_VERSION : nat(), ...body };
}

/**
 * The coordinator's ROUTER path for a control request, in process: the frame opened and admitted
 * as the ROUTER loop does (router-inbox.ts: drop reasons counted), then answered by a coordinator's
 * CoordinatorControl with the runtime guard (dumps and captures really armed). Each input is a new
 * connection, as each CLI run is. A handler that fails for a reason it does not name logs an error:
 * that is a problem here.
 */
export const controlSurface: Surface = {
  name: 'control_request',
  from: 'the coordinator ROUTER: `wavebus status / dump / capture` (AgentMessage.control)',
  async open(dir) {
    const { c, layout, failures } = guardedCoordinator(dir);
    let dropped: string | undefined;
    const drops = new DropCounter(undefined, 'fuzz', (reason) => (dropped = reason));
    let replied = undefined as Record<string, any> | undefined;
    const admission = { drops, versions: new VersionGate(), worldSize: layout.worldSize, reply: (_r: Buffer, msg: Record<string, unknown>) => void (replied = msg) };
    const scratch = new ColumnScratch();
    let conn = 0;
    const feed = (input: Buffer): Outcome => {
      dropped = undefined;
      replied = undefined;
      const routingId = Buffer.alloc(5);
      routingId.writeUInt32BE(++conn, 1);
      const opened = openRouterMessage([routingId, input], DEFAULT_MAX_FRAME_BYTES, undefined, scratch, drops);
      if (opened && admitRouterMessage(opened, admission) !== undefined) {
        if (opened.msg.body !== 'control') return { accepted: `other_body:${opened.msg.body}` }; // another socket surface's input (bench/fuzz.ts)
        const before = failures.length;
        const r = c.control.answer(opened.msg);
        if (failures.length > before) throw new Error(`a control request failed without a named reason: ${failures[failures.length - 1]}`);
        // A refusal names the field it is about first ("capture.format = 9: ..."): counted by code and field.
        return r.error ? { refused: `control:${r.errorCode}:${/^[\w.\[\]]+/.exec(String(r.error))?.[0]}` } : { accepted: `control:${opened.msg.control?.request}` };
      }
      if ((replied as Record<string, any> | undefined)?.refused) return { refused: `refused:${dropped}` };
      if (dropped === undefined) throw new Error('a frame neither taken nor counted as dropped');
      return { refused: `drop:${dropped}` };
    };
    return {
      valid: controlCorpus(),
      craft: (m) => encodeAgentMessage({ requestId: m.int(1000), control: craftControl(m) }),
      feed,
      alive() {
        const o = feed(controlCorpus()[0]);
        if (!('accepted' in o) || o.accepted !== 'control:status') throw new Error(`a valid status request afterwards: ${JSON.stringify(o)}`);
      },
      close() {},
    };
  },
};

// ---------------------------------------------------------------- what `wavebus status` reads back

/** The status document a coordinator answers, from a real one with a capture and a dump armed. */
function statusDoc(dir: string): Record<string, unknown> {
  const { c } = guardedCoordinator(dir);
  c.control.answer({ body: 'control', control: { request: 'capture', capture: { requestIds: ['req-1'] } } } as never);
  c.control.answer({ body: 'control', control: { request: 'dump', dump: { all: true } } } as never);
  return c.control.status();
}

/** A coordinator of another build (or a hostile one) answers `wavebus status` with any JSON: the table is still drawn. */
export const statusReplySurface: Surface = {
  name: 'status_reply',
  from: '`wavebus status`: the status document a coordinator answers (ControlReply.status_json)',
  async open(dir) {
    const doc = statusDoc(dir);
    if (!/capture-1/.test(JSON.stringify(doc))) throw new Error('the status document lists no capture');
    const valid = Buffer.from(JSON.stringify(doc));
    const feed = (input: Buffer, m: Mutator): Outcome => {
      let doc: unknown;
      const text = m.rand() < 0.7 ? mutateJson(m, valid.toString()) : input.toString('utf8');
      try {
        doc = JSON.parse(text);
      } catch {
        return { refused: 'status:not_json' }; // the command says the coordinator's answer is not JSON
      }
      const out = renderStatus(doc, 'tcp://127.0.0.1:29601');
      if (typeof out !== 'string' || out.split('\n').some((l) => l.length > 100)) throw new Error('the table is not text within 100 columns');
      return { accepted: 'table' };
    };
    return { valid: [valid], feed, alive: () => void renderStatus(doc, 'x'), close() {} };
  },
};

