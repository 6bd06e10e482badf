// Fuzz target: `wavebus aggregate`'s file requests through the coordinator (RelayRequest: list and
// fileChunk, for the coordinator's own roots and an agent's), with garbage roots, paths, offsets,
// lengths, ranks and timeouts, valid and mutated, through CURVE when the job has it. Every request
// that decodes is answered once; a file planted outside the roots (also behind links inside them)
// never comes back.
import * as fs from 'fs';
import * as path from 'path';
import { encodeAgentMessage } from '../../src/bus/frames';
import { PROTOCOL_VERSION } from '../../src/bus/protocol-version';
import { AgentMessage, decode } from '../../src/proto';
import type { Job } from './fuzz-coordinator';
import { coversOneof } from './fuzz-kinds';
import { fuzzRouter } from './fuzz-router';
import type { FuzzTarget } from './fuzz-types';

/** The content of the secret planted outside every served root: no reply may ever carry it. */
export const MARKER = 'WAVEBUS-FUZZ-SECRET-7f3a';

/** Files in the coordinator's and agent A's roots, and a secret outside them reachable only through links (once per job). */
export function plant(job: Job): string[] {
  const secret = path.join(job.dir, 'secret.txt');
  if (fs.existsSync(secret)) return [secret];
  fs.writeFileSync(secret, `${MARKER}\n`);
  const wave = path.join(job.dumpDir, 'token_repeat', 'req-1', 'wave_3');
  fs.mkdirSync(path.join(wave, 'dp0_tp0_pp0_cp0'), { recursive: true });
  fs.writeFileSync(path.join(wave, 'manifest.json'), JSON.stringify({ schema: 1, files: [] }));
  fs.writeFileSync(path.join(wave, 'dp0_tp0_pp0_cp0', 'kv.npy'), Buffer.alloc(5000, 1));
  fs.symlinkSync(secret, path.join(wave, 'request_info.json'));
  fs.mkdirSync(path.join(job.reportDir, 'token_repeat'), { recursive: true });
  fs.writeFileSync(path.join(job.reportDir, 'token_repeat', 'report_1.json'), JSON.stringify({ report: 1 }));
  fs.symlinkSync(secret, path.join(job.reportDir, 'token_repeat', 'report_2.json'));
  fs.symlinkSync(job.dir, path.join(job.reportDir, 'up'));
  const ad = job.agent!.dumpRoot;
  fs.mkdirSync(path.join(ad, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0'), { recursive: true });
  fs.writeFileSync(path.join(ad, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0', 'kv.npy'), Buffer.alloc(3 * 2 ** 20, 2));
  fs.symlinkSync(secret, path.join(ad, 'token_repeat', 'req-1', 'wave_3', 'dp0_tp0_pp0_cp0', 'link.npy'));
  fs.symlinkSync(job.dir, path.join(ad, 'escape'));
  return [secret];
}

/** Roots, paths, offsets and lengths of file requests, valid and not (plant() made the valid ones). */
export const FILE_CASES = {
  roots: ['reports', 'dump_records', 'dumps', 'snapshots', '', '..', '/etc', 'reports/..', '\u0000', 'x'.repeat(300)],
  paths: ['token_repeat/report_1.json', 'token_repeat/report_2.json', 'up/secret.txt', 'token_repeat/req-1/wave_3/manifest.json', 'token_repeat/req-1/wave_3/request_info.json',
    'token_repeat/req-1/wave_3/dp0_tp0_pp0_cp0/kv.npy', 'token_repeat/req-1/wave_3/dp0_tp0_pp0_cp0/link.npy', 'escape/secret.txt', '../secret.txt', '../../../../etc/passwd', '/etc/passwd',
    'a/../../b', '', '.', 'token_repeat//report_1.json', 'token_repeat/./report_1.json', '\u0000x', 'é/ü', 'y'.repeat(5000)],
  offsets: [0, 1, 4999, 5000, 3 * 2 ** 20 - 1, 2 ** 32, 2 ** 53 - 1],
  lengths: [0, 1, 2 ** 20, 4 * 2 ** 20, 4 * 2 ** 20 + 1, 2 ** 32 - 1],
};

export function relayCorpus(): Buffer[] {
  const { roots, paths, offsets, lengths } = FILE_CASES;
  const out: Buffer[] = [];
  for (const root of roots) {
    for (const rank of [0, 1, 2 ** 32 - 1]) out.push(encodeAgentMessage({ requestId: out.length + 1, relay: { rank, fileList: { root, prefix: '' }, protocolVersion: PROTOCOL_VERSION } }));
    for (const prefix of paths.slice(0, 8)) out.push(encodeAgentMessage({ requestId: out.length + 1, relay: { rank: 0, fileList: { root, prefix }, protocolVersion: PROTOCOL_VERSION } }));
    for (const p of paths) {
      for (let k = 0; k < 2; k++) {
        const offset = offsets[(out.length + k) % offsets.length];
        const length = lengths[(out.length * 7 + k) % lengths.length];
        out.push(encodeAgentMessage({ requestId: out.length + 1, relay: { rank: 0, fileChunk: { root, path: p, offset, length, received: [1, 2, 2 ** 40] }, timeoutMs: [0, 2000, 2 ** 32 - 1][k], protocolVersion: PROTOCOL_VERSION } }));
      }
    }
  }
  out.push(encodeAgentMessage({ requestId: 9, relay: { rank: 0, protocolVersion: PROTOCOL_VERSION } })); // neither list nor chunk
  out.push(encodeAgentMessage({ requestId: 10, relay: { rank: 0, fileList: { root: 'reports' }, protocolVersion: PROTOCOL_VERSION + 1 } }));
  // agent A's direct file socket (the tool sends it empty; the coordinator fills in its allow-list)
  for (const rank of [0, 1]) out.push(encodeAgentMessage({ requestId: 11 + rank, relay: { rank, fileServe: {}, protocolVersion: PROTOCOL_VERSION } }));
  // a verdict's replay on rank 0's host: the agent refuses it by field (no files), on no live rank the coordinator does
  for (const rank of [0, 2 ** 32 - 1]) out.push(encodeAgentMessage({ requestId: 13 + rank, relay: { rank, replay: { incident: 'incident-wave1-dp0', calls: [1], ranks: [0], devices: [0], timeoutMs: 1000 }, protocolVersion: PROTOCOL_VERSION } }));
  coversOneof('RelayRequest', 'request', out.map((b) => (decode(AgentMessage, b).relay as { request?: string } | undefined)?.request), 'relay');
  return out;
}

export function filesTarget(name: string, jobName: string): FuzzTarget {
  return {
    name,
    async run(ctx) {
      const job = await ctx.job(jobName);
      if (!job.agent) throw new Error(`${name}: job ${jobName} has no agent`);
      plant(job);
      const corpus = relayCorpus();
      const m = ctx.m;
      const token = job.coord.token;
      const leaks: string[] = [];
      let relayReplies = 0;
      const make = () => {
        const valid = m.pick(corpus);
        const msg = m.rand() < 0.6 ? valid : m.mutate(valid);
        return [token ? token.seal('to-coordinator', msg) : msg];
      };
      const r = await fuzzRouter(ctx, name, job, make, {
        token,
        onReply: (parts) => {
          relayReplies++;
          if (parts.some((p) => p.includes(MARKER))) leaks.push(`a reply carried the secret outside the roots (${parts.map((p) => p.length).join('+')} bytes)`);
        },
        waitRelays: true,
      });
      r.problems.push(...leaks);
      if (leaks.length > 0) r.accounted = false;
      r.relay_replies = relayReplies;
      return r;
    },
  };
}
