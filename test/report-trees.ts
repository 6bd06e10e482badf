// Trees for the report and trace tests: one made by a real job (the in-process harness: a
// coordinator with the guard, real agents and clients, TP=2 × DP=2), and a generated one of any
// size (64 ranks, 100 incidents) written in the layout the guard and agents write.
import * as fs from 'fs';
import * as path from 'path';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { npyHeader } from '../src/artifacts/npy';
import type { StepTelemetry } from '../src/messages';
import { kvRankDirFor } from '../src/paths';
import { replicaDumpRanks, type WorldLayout } from '../src/layout';
import { waitFor } from './helpers';
import { runReplicaWave, startHarnessJob, step, stopHarnessJob } from './job-harness';

export interface JobTree {
  root: string;
  dumpRoot: string;
  layout: WorldLayout;
}

/**
 * A real job: replica 0's request turns NaN in wave 2, replica 1's in wave 4; both are reported
 * and dumped (report + dump_kv), token ids kept (save_sensitive_info). Stopped before it returns:
 * every agent wrote its timeline, the guard its config history.
 */
export async function realJobTree(): Promise<JobTree> {
  const job = await startHarnessJob({
    tp: 2,
    dp: 2,
    runtimeConfig: {
      detector: { logits_finite: { enabled: true, on_trigger: ['report', 'dump_kv'] } },
      dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
      report: { save_sensitive_info: true },
    },
  });
  try {
    const blocks = [[1, 2], [5, 6, 7]];
    const prev: Array<StepTelemetry | undefined> = [undefined, undefined];
    const nanAt = [2, 4];
    for (let w = 1; w <= 9; w++) {
      for (const r of [0, 1]) {
        await runReplicaWave(job, r, w, prev[r]);
        prev[r] = { wave: w, requests: [step(`req-${r}`, [100 + w], blocks[r], { numOutputTokens: w })], nonFinite: w === nanAt[r] ? [{ row: 0, reqId: `req-${r}`, kind: 'nan' }] : [] };
      }
    }
    const manifests = () => ['0', '1'].map((r) => fs.existsSync(path.join(job.dumpRoot, 'logits_finite', `req-${r}`)) && fs.readdirSync(path.join(job.dumpRoot, 'logits_finite', `req-${r}`)).some((w) => fs.existsSync(path.join(job.dumpRoot, 'logits_finite', `req-${r}`, w, 'manifest.json'))));
    await waitFor(() => manifests().every(Boolean), 'both dumps have their manifest');
    for (const r of job.ranks) await r.agent.drain();
  } finally {
    await stopHarnessJob(job);
  }
  return { root: job.root, dumpRoot: job.dumpRoot, layout: job.layout };
}

const TYPES = ['token_repeat', 'logits_finite', 'garbled', 'spec_acceptance'];
const json = (file: string, v: unknown) => {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `${JSON.stringify(v, null, 2)}\n`);
};

/**
 * A generated tree: TP=tp × DP=dp ranks on `hosts` hosts, `incidents` incidents spread over the
 * replicas, each with a complete KV dump (2 layers, k and v, float32 .npy) from its replica's ranks.
 */
export function generatedTree(root: string, opts: { tp: number; dp: number; incidents: number; hosts: number }): { layout: WorldLayout; rankDirs: number } {
  const layout: WorldLayout = { worldSize: opts.tp * opts.dp, tp: opts.tp, pp: 1, dp: opts.dp, cp: 1 };
  const layoutJ = { world_size: layout.worldSize, tp: layout.tp, pp: 1, dp: layout.dp, cp: 1 };
  const kv = path.join(root, 'runtime', 'report', 'kv_cache');
  json(path.join(root, 'runtime', 'config', 'runtime_config.json'), { detector: { logits_finite: { enabled: true } }, report: { save_sensitive_info: false } });
  let rankDirs = 0;
  const shape = [2, 4, 1, 8];
  for (let i = 0; i < opts.incidents; i++) {
    const type = TYPES[i % TYPES.length];
    const replica = i % opts.dp;
    const req = `req-${i}`;
    const detect = 10 + i * 3;
    const arm = detect + 2;
    const waveDir = path.join(kv, type, req, `wave_${arm}${opts.dp > 1 ? `_dp${replica}` : ''}`);
    const ranks = replicaDumpRanks(layout, replica);
    const files: Record<string, unknown[]> = {};
    const dirs: Record<string, string> = {};
    for (const g of ranks) {
      const name = kvRankDirFor(g, layout);
      dirs[g] = name;
      const dir = path.join(waveDir, name);
      fs.mkdirSync(dir, { recursive: true });
      const listed: { path: string; bytes: number; checksum: string }[] = [];
      for (let l = 0; l < 2; l++) {
        for (const k of ['k', 'v']) {
          const data = new Float32Array(64).map((_, j) => Math.sin(i + g + l + j) * (k === 'k' ? 1 : 2));
          const buf = Buffer.concat([npyHeader('float32', shape), Buffer.from(data.buffer)]);
          const f = `layers.${l}.${k}.npy`;
          fs.writeFileSync(path.join(dir, f), buf);
          listed.push({ path: f, bytes: buf.length, checksum: formatChecksum(crc32c(buf)) });
        }
      }
      const identity = { global_rank: g, tp_rank: g % opts.tp, tp_size: opts.tp, dp_rank: replica, dp_size: opts.dp, pp_rank: 0, pp_size: 1, cp_rank: 0, cp_size: 1, host: `host${Math.floor(g / (layout.worldSize / opts.hosts))}` };
      const dumpJson = { arm_wave: arm, detect_wave: detect, dp_rank: replica, req_id: req, incident_type: type, format: 'npy', block_ids: [1, 2], identity, files: listed, layers: [0, 1].map((l) => ({ layer: `layers.${l}`, dtype: 'float32', shape })) };
      json(path.join(dir, 'dump.json'), dumpJson);
      const dumpBuf = fs.readFileSync(path.join(dir, 'dump.json'));
      files[g] = [...listed.map((f) => ({ ...f, path: `${name}/${f.path}` })), { path: `${name}/dump.json`, bytes: dumpBuf.length, checksum: formatChecksum(crc32c(dumpBuf)) }];
      rankDirs++;
    }
    const info = { job_id: `${arm}/${type}/${req}`, incident_type: type, req_id: req, dp_rank: replica, detect_wave: detect, arm_wave: arm, block_ids: [1, 2], rank: ranks[0], expected_ranks: ranks, pp_stages: 'last', layout: layoutJ };
    json(path.join(waveDir, 'request_info.json'), info);
    json(path.join(waveDir, 'manifest.json'), { ...info, dirs, completed_ranks: ranks, missing_ranks: [], failed_ranks: {}, skipped_ranks: {}, complete: true, timed_out: false, files });
    const ts = new Date(Date.UTC(2026, 11, 1, 12, 0, 0) + i * 1000).toISOString();
    json(path.join(root, 'runtime', 'report', type, `report_20261201_120000_${String(i).padStart(3, '0')}_${req}_pid1.json`), {
      ts, incident_type: type, req_id: req, rank: ranks[0], dp_rank: replica, detect_wave: detect, dump_attempted: true, dump_arm_wave: arm, dump_count: 1, dump_max_times: 1000, dump_dir: waveDir, detail: { threshold: 64, score: i }, block_ids: [1, 2],
    });
  }
  for (let g = 0; g < layout.worldSize; g++) {
    json(path.join(kv, 'timeline', `rank${g}.json`), { kind: 'wavebus_timeline', version: 1, global_rank: g, identity: { tp_rank: g % opts.tp, dp_rank: Math.floor(g / opts.tp), pp_rank: 0, cp_rank: 0, host: `host${Math.floor(g / (layout.worldSize / opts.hosts))}` }, kinds: ['vector', 'end_of_wave', 'late_vector', 'missed_vector', 'dump', 'capture'], fields: ['kind', 'wave', 'start_ms', 'dur_ms', 'arg'], recorded: 0, overwritten: 0, entries: [] });
  }
  return { layout, rankDirs };
}
