// `wavebus demo`: a simulated TP job on this machine with the coordinator, agents, every
// detector and an input-snapshot rule on, and faults injected. It runs `wavebus launch` once per
// simulated host, exactly as a user would, then checks every artifact and prints a summary.
import { isTensorFormat, type TensorFormat } from '../artifacts/tensor-format';
import * as fs from 'fs';
import * as path from 'path';
import { packageRoot } from '../paths';
import { spawn } from 'child_process';
import { ConfigError } from '../errors';
import { inspectTree, type BundleReport } from './inspect';
import { freePortPair } from '../bus/ports';
import { kvDumpFileName, tensorFile } from '../artifacts/tensor-files';
import { safeComponent } from '../artifacts/sanitize';
import { readBytes } from '../artifacts/read-range';
import { kvBlockBytes, type KvGeometry } from '../sim/kv-pattern';
import { DEMO_FAULTS } from '../sim/faults';
import { replicaDumpRanks } from '../layout';
import { TORCH_CAPTURE_TOKEN, TORCH_FAULTS, torchEngineCommand, torchPoolBlocks } from './demo-torch';
import { HF_CAPTURE_TOKEN, HF_FAULTS, checkTransformersDump, transformersEngineCommand } from './demo-transformers';
import { loadCallDir } from '../snapshot/loader';
import { demoExpectations, type DemoExpectations } from './demo-expect';
import type { SnapshotFlags } from '../snapshot/config';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { writeReport } from './report';
import { writeTrace } from './trace';

export interface DemoOptions {
  out: string;
  tp: number;
  pp: number;
  dp: number;
  hosts: number;
  steps: number;
  format: TensorFormat;
  runtimeConfig?: string;
  port?: number;
  /** 'sim' (default): the simulator; 'torch': examples/torch-engine (torch 2.x's torchrun, or python3-torch with the stand-in);
   *  'transformers': examples/transformers-engine (the torch 2.x venv, scripts/torch2-venv.js). */
  engine?: 'sim' | 'torch' | 'transformers';
  log?: (line: string) => void;
}

export const DEMO_GEOMETRY = { layers: 4, numBlocks: 256, blockSize: 16, totalKvHeads: 8, headDim: 64, dtype: 'bfloat16' as const };
const MARKER = '.wavebus-demo';
export { demoRuntimeConfig } from './demo-expect';

function prepareOut(out: string): void {
  if (fs.existsSync(out)) {
    const entries = fs.readdirSync(out);
    if (entries.length > 0 && !entries.includes(MARKER)) {
      throw new ConfigError(`--out ${out} exists and is not a wavebus demo directory; choose an empty or new directory`);
    }
    for (const e of entries) fs.rmSync(path.join(out, e), { recursive: true, force: true });
  }
  mkdirTrustedSync(out, 0o755, '--out');
  fs.writeFileSync(path.join(out, MARKER), 'made by wavebus demo; its contents are replaced on the next run\n');
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv, logFile: string): Promise<number> {
  return new Promise((resolve) => {
    const log = fs.openSync(logFile, 'a');
    const child = spawn(cmd, args, { env, stdio: ['ignore', log, log] });
    const stop = (): void => void child.kill('SIGTERM');
    process.once('SIGINT', stop);
    child.on('exit', (code, signal) => {
      process.off('SIGINT', stop);
      fs.closeSync(log);
      resolve(code ?? 128 + (signal ? 15 : 0));
    });
  });
}

interface DumpCheck {
  dir: string;
  incidentType: string;
  reqId: string;
  replica: number;
  ranks: number[];
  expected: number[];
  bytes: number;
  problems: string[];
}

/** Compare every dumped K/V block with the bytes the simulated engine held. */
export function checkDumpContents(rankDir: BundleReport, root: string, tp: number, torchOut?: string): string[] {
  const problems: string[] = [];
  const dir = path.join(root, rankDir.dir);
  const doc = JSON.parse(fs.readFileSync(path.join(dir, 'dump.json'), 'utf8'));
  const rank = Number(doc.identity.global_rank);
  const g: KvGeometry = { layers: DEMO_GEOMETRY.layers, numBlocks: DEMO_GEOMETRY.numBlocks, blockSize: DEMO_GEOMETRY.blockSize, kvHeads: DEMO_GEOMETRY.totalKvHeads / tp, headDim: DEMO_GEOMETRY.headDim, dtype: DEMO_GEOMETRY.dtype };
  const blocks: number[] = doc.block_ids;
  const format = doc.format;
  if (!isTensorFormat(format)) return [`${rankDir.dir}: dump.json format ${JSON.stringify(format)} is not a tensor format`];
  for (const [li, layer] of (doc.layers as { layer: string }[]).entries()) {
    const layerIndex = Number(/layers\.(\d+)\./.exec(layer.layer)?.[1] ?? li);
    for (const kv of ['k', 'v'] as const) {
      // The file dump-executor wrote for this layer and kv, by the format's own naming.
      const name = kvDumpFileName(safeComponent(layer.layer, 'layer name'), format, kv);
      const file = (doc.files as { path: string }[]).map((f) => path.basename(f.path)).find((n) => n === name);
      if (!file) {
        problems.push(`${rankDir.dir}: no file for ${layer.layer} ${kv}`);
        continue;
      }
      const p = path.join(dir, file);
      const { tensors, lone } = tensorFile(format).read(p);
      const t = lone ? tensors[0] : tensors.find((x) => x.name === kv);
      if (!t) {
        problems.push(`${rankDir.dir}/${file}: no ${kv} tensor`);
        continue;
      }
      const data = readBytes(p, t.offset, t.nbytes);
      const want = torchOut ? torchPoolBlocks(torchOut, rankDir.dir, rank, layer.layer, kv, blocks) : Buffer.concat(blocks.map((b) => kvBlockBytes(g, layerIndex, kv, b, rank)));
      if (!data.equals(want)) problems.push(`${rankDir.dir}/${file}: ${kv} bytes differ from the engine's KV blocks [${blocks.join(',')}]`);
    }
  }
  return problems;
}

export async function runDemo(opts: DemoOptions): Promise<{ ok: boolean; summary: Record<string, unknown> }> {
  const log = opts.log ?? ((l: string) => process.stdout.write(`${l}\n`));
  const world = opts.tp * opts.pp * opts.dp;
  if (world % opts.hosts !== 0) throw new ConfigError(`--hosts ${opts.hosts} must divide tp*pp*dp = ${world}`);
  const out = path.resolve(opts.out);
  prepareOut(out);
  const runtimeRoot = path.join(out, 'runtime');
  const configPath = path.join(runtimeRoot, 'config', 'runtime_config.json');
  mkdirTrustedSync(path.dirname(configPath), 0o755, 'runtime config directory');
  const resultDir = path.join(out, 'ranks');
  const port = opts.port ?? (await freePortPair());
  const bin = path.join(packageRoot(), 'bin', 'wavebus.js');
  // Artifacts stay under --out whichever snapshot variables name the capture.
  const env: NodeJS.ProcessEnv = { ...process.env, WAVEBUS_CACHE_ROOT: out, VLLM_CACHE_ROOT: path.join(out, 'vllm-cache') };
  const layout = { worldSize: world, tp: opts.tp, pp: opts.pp, dp: opts.dp, cp: 1 };
  const torch = opts.engine === 'torch';
  const hf = opts.engine === 'transformers';
  const faults = torch ? TORCH_FAULTS : hf ? HF_FAULTS : DEMO_FAULTS;
  const expect = demoExpectations({ runtimeConfig: opts.runtimeConfig, format: opts.format, layout, faults, env, captureToken: torch ? TORCH_CAPTURE_TOKEN : hf ? HF_CAPTURE_TOKEN : undefined });
  const job = torch
    ? torchEngineCommand({ ...opts, out: path.join(out, 'engine'), resultDir })
    : hf
      ? transformersEngineCommand({ ...opts, out: path.join(out, 'engine'), resultDir, log })
      : [process.execPath, bin, 'sim', '--steps', String(opts.steps), '--step-ms', '40', '--faults', JSON.stringify(DEMO_FAULTS), '--result-dir', resultDir];
  const nproc = world / opts.hosts;
  const startAt = Date.now() + 4000;
  log(`wavebus demo: TP=${opts.tp} PP=${opts.pp} DP=${opts.dp} on ${opts.hosts} simulated host(s), ${opts.steps} steps, engine ${torch ? 'torch (examples/torch-engine)' : hf ? 'transformers (examples/transformers-engine, torchrun)' : 'sim'}; faults: ${Object.keys(faults).join(', ')}`);
  const at = `--coordinator 127.0.0.1:${port}${opts.hosts === 1 ? ` --bus-token-file ${path.join(opts.out, 'bus.token')}` : ''}`;
  log(`while it runs: wavebus status ${at}   (also wavebus dump / capture, docs/control.md)`);
  const codes = await Promise.all(
    Array.from({ length: opts.hosts }, (_, node) =>
      run(
        process.execPath,
        [
          bin, 'launch',
          '--nnodes', String(opts.hosts), '--node-rank', String(node), '--nproc-per-node', String(nproc),
          '--master-addr', '127.0.0.1', '--port', String(port),
          '--tp', String(opts.tp), '--pp', String(opts.pp), '--dp', String(opts.dp),
          // The runtime config is the startup overlay: startup writes defaults <- overlay to the file (seed).
          '--runtime-config-path', configPath, '--runtime-config-hot-reload',
          // The job's bus token beside its artifacts while it runs: `wavebus status --bus-token-file DIR/bus.token`.
          '--bus-token-dir', out,
          '--additional-config', JSON.stringify({ runtime_config: expect.overlay }),
          ...snapshotArgs(expect.snapshotFlags),
          // A shared 2-core machine can delay a wave vector by tens of ms; real forwards are longer.
          '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=250',
          '--',
          ...job, ...(torch || hf ? [] : ['--start-at', String(startAt)]),
        ],
        env,
        path.join(out, `launch-host${node}.log`),
      ),
    ),
  );
  return summarize(out, runtimeRoot, opts, expect, codes, log);
}

/** `wavebus launch` flags for the snapshot settings the demo sets itself. */
function snapshotArgs(flags: Partial<SnapshotFlags>): string[] {
  const out: string[] = [];
  for (const [k, v] of Object.entries(flags)) {
    const flag = `--snapshot-${k.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase())}`;
    if (typeof v === 'boolean') out.push(`${flag}=${v}`);
    else out.push(flag, String(v));
  }
  return out;
}

function summarize(out: string, runtimeRoot: string, opts: DemoOptions, expect: DemoExpectations, codes: number[], log: (l: string) => void): { ok: boolean; summary: Record<string, unknown> } {
  const problems: string[] = [];
  codes.forEach((c, i) => c !== 0 && problems.push(`launch on host ${i} exited ${c} (see ${path.join(out, `launch-host${i}.log`)})`));
  const world = opts.tp * opts.pp * opts.dp;
  const layout = { worldSize: world, tp: opts.tp, pp: opts.pp, dp: opts.dp, cp: 1 };

  // Incidents.
  const reportDir = path.join(runtimeRoot, 'report');
  const incidents: Record<string, number> = {};
  for (const t of fs.existsSync(reportDir) ? fs.readdirSync(reportDir) : []) {
    if (t === 'kv_cache') continue;
    incidents[t] = fs.readdirSync(path.join(reportDir, t)).filter((f) => f.endsWith('.json')).length;
  }
  for (const d of expect.detectors) {
    if (d.report && !incidents[d.name]) problems.push(`no ${d.name} incident was reported (a fault for it was injected and the detector is on)`);
    if (!d.report && incidents[d.name]) problems.push(`${incidents[d.name]} ${d.name} incident(s) were reported, none expected (${d.why})`);
  }

  // KV dumps.
  const kvRoot = path.join(reportDir, 'kv_cache');
  const kv = fs.existsSync(kvRoot) ? inspectTree(kvRoot, { verify: true }) : { bundles: [], problems: [`${kvRoot} missing`], incomplete: [] as string[] };
  problems.push(...kv.problems);
  const waves = kv.bundles.filter((b) => b.kind === 'dump_wave');
  const rankBundles = kv.bundles.filter((b) => b.kind === 'kv_dump');
  const autoWaves = waves.filter((w) => w.info.incident_type !== 'manual_trigger');
  if (autoWaves.length < expect.autoDumps.min) problems.push('no KV dump was written (a detector that dumps was expected to fire)');
  if (autoWaves.length > expect.autoDumps.max) problems.push(`${autoWaves.length} automatic KV dumps were written, at most ${expect.autoDumps.max} expected (${expect.autoDumps.why ?? 'dump.auto_max_times'})`);
  const dumpTypes = new Set(expect.detectors.filter((d) => d.dump).map((d) => d.name as string));
  for (const w of autoWaves) if (!dumpTypes.has(String(w.info.incident_type))) problems.push(`${w.dir}: a ${w.info.incident_type} dump, not expected from the config in force`);
  const dumps: DumpCheck[] = waves.map((w) => {
    const mine = rankBundles.filter((r) => r.dir.startsWith(`${w.dir}/`));
    // Each dump belongs to one replica: exactly that replica's dump ranks, and no other rank.
    const info = JSON.parse(fs.readFileSync(path.join(kvRoot, w.dir, 'request_info.json'), 'utf8'));
    const replica = Number(info.dp_rank ?? 0);
    const expected = replicaDumpRanks(layout, replica, expect.config.dump.pp_stages);
    const dc: DumpCheck = { dir: w.dir, incidentType: String(w.info.incident_type), reqId: String(w.info.req_id), replica, ranks: w.ranks, expected, bytes: mine.reduce((n, r) => n + r.bytes, 0), problems: [] };
    for (const g of expected) if (!w.ranks.includes(g)) dc.problems.push(`${w.dir}: rank ${g} missing`);
    for (const g of w.ranks) if (!expected.includes(g)) dc.problems.push(`${w.dir}: rank ${g} copied a dump of replica ${replica} (expected only [${expected.join(', ')}])`);
    if (JSON.stringify(info.expected_ranks) !== JSON.stringify(expected)) dc.problems.push(`${w.dir}: request_info.json expected_ranks ${JSON.stringify(info.expected_ranks)}, want [${expected.join(',')}]`);
    if (opts.engine === 'transformers') dc.problems.push(...checkTransformersDump(path.join(kvRoot, w.dir), path.join(out, 'engine')));
    else for (const r of mine) dc.problems.push(...checkDumpContents(r, kvRoot, opts.tp, opts.engine === 'torch' ? path.join(out, 'engine') : undefined));
    problems.push(...dc.problems);
    return dc;
  });
  // Faults are injected into every replica: each one must have dumped.
  for (let r = 0; r < opts.dp && expect.autoDumps.min > 0; r++) {
    if (!dumps.some((d) => d.replica === r && d.incidentType !== 'manual_trigger')) problems.push(`replica ${r} (dp rank ${r}) wrote no automatic KV dump`);
  }
  const bytesByRank: Record<number, number> = {};
  for (const r of rankBundles) bytesByRank[r.ranks[0]] = (bytesByRank[r.ranks[0]] ?? 0) + r.bytes;

  // Snapshots.
  const snapRoot = expect.snapshot.snapshotRoot;
  const snaps = fs.existsSync(snapRoot) ? inspectTree(snapRoot, { verify: true }) : { bundles: [], problems: [`${snapRoot} missing`], incomplete: [] as string[] };
  problems.push(...snaps.problems);
  const snapByRank: Record<number, number> = {};
  // A bundle no rule of the demo's selected was armed on the running job (`wavebus capture`): its own budget, listed apart.
  const sc = expect.snapshot;
  const own = new Set<string>([...(sc.tokenTargets.size > 0 ? ['token'] : []), ...(sc.requestIds.length > 0 ? ['request'] : []), ...(sc.callRule.kind !== 'never' ? ['call_index'] : [])]);
  const armedByRank: Record<number, number> = {};
  for (const b of snaps.bundles.filter((x) => x.kind === 'snapshot')) {
    const by = ((b.info as { selected_by?: unknown } | undefined)?.selected_by ?? []) as string[];
    const count = Array.isArray(by) && by.some((r) => own.has(r)) ? snapByRank : armedByRank;
    count[b.ranks[0]] = (count[b.ranks[0]] ?? 0) + 1;
  }
  for (let g = 0; g < world; g++) {
    const want = expect.snapshotRanks.includes(g);
    const n = snapByRank[g] ?? 0;
    if (want && n === 0) problems.push(`rank ${g} wrote no input snapshot`);
    if (want && n > expect.snapshot.maxCaptures) problems.push(`rank ${g} wrote ${n} input snapshots, over the budget of ${expect.snapshot.maxCaptures}`);
    if (!want && n > 0) problems.push(`rank ${g} wrote ${n} input snapshot(s), none expected (${expect.snapshotWhy ?? 'not selected'})`);
  }

  // Engine side.
  const rankResults = fs.existsSync(path.join(out, 'ranks'))
    ? fs.readdirSync(path.join(out, 'ranks')).filter((f) => /^rank\d+\.json$/.test(f)).map((f) => JSON.parse(fs.readFileSync(path.join(out, 'ranks', f), 'utf8')))
    : [];
  const timeouts = rankResults.reduce((n, r) => n + r.endOfWaveTimeouts, 0);
  if (rankResults.length !== world) problems.push(`${world - rankResults.length} engine rank(s) did not finish`);

  log('');
  log('incidents by type');
  for (const [t, n] of Object.entries(incidents).sort()) log(`  ${t.padEnd(18)} ${n}`);
  const off = expect.detectors.filter((d) => d.why);
  if (off.length) {
    log('');
    log('nothing expected from');
    for (const d of off) log(`  ${d.name.padEnd(18)} ${d.report ? 'no dump: ' : ''}${d.why}`);
  }
  log('');
  log(`KV dumps (${dumps.length})${dumps.length ? `, each from its replica's ${expect.config.dump.pp_stages === 'all' ? 'ranks of every stage' : 'last-PP ranks'}` : expect.autoDumps.why ? ` (${expect.autoDumps.why})` : ''}`);
  for (const d of dumps) {
    const missing = d.expected.filter((g) => !d.ranks.includes(g));
    log(`  dp${d.replica} ${d.incidentType.padEnd(16)} ${d.reqId.padEnd(18)} ranks ${d.ranks.length}/${d.expected.length} ${String(d.bytes).padStart(9)} B${missing.length ? `  MISSING ${missing.join(',')}` : ''}${d.problems.length ? '  BAD' : ''}`);
  }
  log('');
  log('bytes dumped by rank');
  for (const [g, b] of Object.entries(bytesByRank)) log(`  rank${g.padEnd(4)} ${String(b).padStart(10)} B`);
  log('');
  log(`input snapshots by rank: ${Object.entries(snapByRank).map(([g, n]) => `rank${g}=${n}`).join(' ') || 'none'}${expect.snapshotWhy ? ` (${expect.snapshotWhy})` : ''}`);
  if (Object.keys(armedByRank).length > 0) log(`  and armed while it ran (wavebus capture): ${Object.entries(armedByRank).map(([g, n]) => `rank${g}=${n}`).join(' ')}`);
  log(`end_of_wave waits past the bound: ${timeouts}`);
  log('');
  log(`reports:   ${reportDir}`);
  log(`KV dumps:  ${kvRoot}`);
  log(`snapshots: ${snapRoot}`);
  log(`logs:      ${out}/launch-host*.log`);
  // The page and the trace of what just happened (docs/report.md).
  const page = writeReport(out, { out: path.join(out, 'report.html') });
  const trace = writeTrace(out, path.join(out, 'job.trace.json'));
  log(`trace:     ${trace.file} (open in https://ui.perfetto.dev or chrome://tracing)`);
  log(`report:    ${page.file}`);
  const ok = problems.length === 0;
  log('');
  if (ok) log('demo OK: every expected artifact was written and verified');
  else {
    log(`demo FAILED: ${problems.length} problem(s)`);
    for (const p of problems.slice(0, 30)) log(`  - ${p}`);
  }
  return { ok, summary: { incidents, dumps: dumps.length, bytesByRank, snapshots: snapByRank, timeouts, problems } };
}

/** Re-check a snapshot call dir through the replay loader (used by tests and the demo docs). */
export async function verifySnapshotDir(dir: string): Promise<number> {
  const call = await loadCallDir(dir);
  return call.tensors.length;
}
