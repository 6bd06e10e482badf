// `wavebus bench transformers`: Hugging Face transformers' continuous batching (a small random
// Llama, TP over gloo on CPU under torch's torchrun) with --requests requests running at once, its
// steps/s in a window where every request decodes, in four modes run in turn: wavebus absent (the
// engine never imports wavebus_client), attached with everything off, attached with the detectors
// on, and the seed's path (its per-step due broadcast and Python detectors in the engine's step,
// bench/transformers_engine.py). Each rank also times the layer around the engine's step (attach's
// wrappers, or the seed's work): the client's cost per step. Runs in the torch 2.x venv
// (scripts/torch2-venv.js makes it from the machine's local pip indexes).
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { BenchArgs, BenchFlags } from './lib/flags';
import { freePortPair } from '../src/bus/ports';
import { packageRoot } from '../src/paths';

const BIN = path.resolve(__dirname, '..', '..', 'bin', 'wavebus.js');
const MODES = ['absent', 'off', 'on', 'seed'] as const;
type Mode = (typeof MODES)[number];

export const summary = "transformers' continuous batching (TP over gloo, a small random Llama) with 256 running requests: steps/s with wavebus absent, off, detectors on, and the seed's in-engine path, and the client's µs per step.";
export const flags = {
  requests: { type: 'int', default: 256, describe: 'requests running at once (all admitted before the window; the cache is sized to hold them)' },
  tp: { type: 'int', default: 2, max: 8, describe: 'tensor-parallel ranks (torchrun processes on this host)' },
  'warmup-steps': { type: 'int', default: 20, describe: 'steps before the window (prefill of every request and warm-up)' },
  'measure-steps': { type: 'int', default: 60, describe: 'steps in the window' },
  rounds: { type: 'int', default: 2, describe: 'rounds of the four modes in turn; the best rate of each mode is kept' },
  layers: { type: 'int', default: 2, describe: "the model's decoder layers" },
  hidden: { type: 'int', default: 64, describe: "the model's hidden size (4 query heads, 2 KV heads)" },
  vocab: { type: 'int', default: 256, describe: "the model's vocabulary" },
} satisfies BenchFlags;

interface RankResult {
  mode: Mode;
  rank: number;
  requests: number;
  steps: number;
  steps_per_s: number;
  rows_min: number;
  rows_max: number;
  cpu_us_per_step: number;
  layer_us_per_step: number;
  send_head_us_per_step: number;
  logits_hook_us_per_step: number;
  seed_alerts: number;
  waves: number | null;
  wavebus_imported: boolean;
  heads: { ring_heads: number; inline_heads: number } | null;
}

function engineScript(): string {
  // dist/bench -> bench/transformers_engine.py in the package (tsc does not copy it); from the sources, ./
  const inPackage = path.resolve(__dirname, '..', '..', 'bench', 'transformers_engine.py');
  return fs.existsSync(inPackage) ? inPackage : path.resolve(__dirname, 'transformers_engine.py');
}

function venv(): { python: string; torchrun: string } {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { ensure } = require(path.join(packageRoot(), 'scripts', 'torch2-venv.js')) as { ensure: () => { python: string; torchrun: string } };
  return ensure();
}

function runProc(cmd: string, args: string[], env: NodeJS.ProcessEnv, cwd: string, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env, cwd, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (b) => (err = (err + b.toString()).slice(-6000)));
    child.on('error', reject);
    child.on('exit', (code, sig) => (code === 0 ? resolve() : reject(new Error(`bench transformers: ${what} exited ${code ?? sig}: ${err}`))));
  });
}

function readRanks(dir: string, tp: number, mode: Mode): RankResult[] {
  const out: RankResult[] = [];
  for (let r = 0; r < tp; r++) {
    const f = path.join(dir, `rank${r}.json`);
    if (!fs.existsSync(f)) throw new Error(`bench transformers: ${mode}: rank ${r} wrote no result (${f})`);
    out.push(JSON.parse(fs.readFileSync(f, 'utf8')) as RankResult);
  }
  return out;
}

const fixed = (x: number, d: number) => Number(x.toFixed(d));

/** Incident report files (report_*.json) under a run's directory. */
function countReports(dir: string): number {
  let n = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) n += countReports(path.join(dir, e.name));
    else if (e.isFile() && /^report_.*\.json$/.test(e.name)) n++;
  }
  return n;
}

export async function run(a: BenchArgs<typeof flags>): Promise<Record<string, unknown>> {
  const { python, torchrun } = venv();
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-bench-transformers-'));
  try {
    const model = path.join(work, 'model');
    const env: NodeJS.ProcessEnv = { ...process.env, WAVEBUS_LOG_LEVEL: 'error', WAVEBUS_CACHE_ROOT: path.join(work, 'cache'), OMP_NUM_THREADS: '1' };
    await runProc(python, [path.join(packageRoot(), 'examples', 'transformers-engine', 'make_model.py'), model,
      '--layers', String(a.layers), '--hidden', String(a.hidden), '--vocab', String(a.vocab)], env, work, 'make_model.py');
    const configs: Record<'off' | 'on', object> = {
      off: {},
      on: { detector: { token_repeat: { enabled: true }, logits_finite: { enabled: true } } },
    };
    const runs: Record<Mode, RankResult[][]> = { absent: [], off: [], on: [], seed: [] };
    /** Incident reports the job wrote (off, on): the detectors really ran, or really did not. */
    const incidents: Record<'off' | 'on', number[]> = { off: [], on: [] };
    for (let round = 0; round < a.rounds; round++) {
      for (const mode of MODES) {
        const dir = path.join(work, `r${round}-${mode}`);
        const out = path.join(dir, 'out');
        fs.mkdirSync(dir);
        const engine = ['--standalone', '--nproc-per-node', String(a.tp), engineScript(), mode, '--model', model, '--out', out,
          '--requests', String(a.requests), '--warmup-steps', String(a['warmup-steps']), '--measure-steps', String(a['measure-steps'])];
        if (mode === 'absent' || mode === 'seed') {
          await runProc(torchrun, engine, env, dir, `${mode} run`);
        } else {
          const port = await freePortPair();
          await runProc(process.execPath, [BIN, 'launch', '--nproc-per-node', String(a.tp), '--tp', String(a.tp), '--port', String(port),
            '--run-dir', path.join(dir, 'run'), '--additional-config', JSON.stringify({ runtime_config: configs[mode] }),
            '--', torchrun, ...engine], env, dir, `${mode} run`);
          incidents[mode].push(countReports(dir));
        }
        runs[mode].push(readRanks(out, a.tp, mode));
      }
    }
    const rate = (rs: RankResult[]) => rs.reduce((s, r) => s + r.steps_per_s, 0) / rs.length;
    const best = (mode: Mode) => runs[mode].reduce((b, rs) => (rate(rs) > rate(b) ? rs : b));
    const absent = rate(best('absent'));
    const modes = Object.fromEntries(MODES.map((m) => {
      const rs = best(m);
      return [m, {
        steps_per_s: fixed(rate(rs), 2),
        ratio: fixed(rate(rs) / absent, 4),
        // attach's wrappers (off, on) or the seed's work (seed); in absent, the timers' own cost.
        layer_us_per_step_by_rank: rs.map((r) => fixed(r.layer_us_per_step, 1)),
        // Parts of the layer: attach's send_head (the wave head with the telemetry) and the logits hook.
        ...(m === 'off' || m === 'on' ? { send_head_us_per_step_by_rank: rs.map((r) => fixed(r.send_head_us_per_step, 1)) } : {}),
        // The tensor path's wave heads over the whole run (TP0 sends; the others' are paused): through the ring, or inline.
        ...(m === 'off' || m === 'on' ? { heads_by_rank: rs.map((r) => r.heads) } : {}),
        logits_hook_us_per_step_by_rank: rs.map((r) => fixed(r.logits_hook_us_per_step, 1)),
        cpu_us_per_step_by_rank: rs.map((r) => fixed(r.cpu_us_per_step, 0)),
        running_requests: [Math.min(...rs.map((r) => r.rows_min)), Math.max(...rs.map((r) => r.rows_max))],
        wavebus_imported: rs.some((r) => r.wavebus_imported),
        ...(m === 'seed' ? { seed_alerts_tp0: rs[0].seed_alerts } : {}),
        ...(m === 'off' || m === 'on' ? { incident_reports_by_round: incidents[m] } : {}),
        all_rounds_steps_per_s: runs[m].map((x) => fixed(rate(x), 2)),
      }];
    }));
    const layer = (m: Mode) => Math.max(...best(m).map((r) => r.layer_us_per_step));
    return {
      bench: 'transformers',
      requests: a.requests,
      tp: a.tp,
      model: { layers: a.layers, hidden: a.hidden, vocab: a.vocab, heads: 4, kv_heads: 2 },
      window: { warmup_steps: a['warmup-steps'], measure_steps: a['measure-steps'] },
      rounds: a.rounds,
      modes,
      // The worst rank's µs per step in the layer, less the same timers' cost with nothing there.
      client_us_per_step: { off: fixed(layer('off') - layer('absent'), 1), on: fixed(layer('on') - layer('absent'), 1), seed: fixed(layer('seed') - layer('absent'), 1) },
      host: { cpus: os.cpus().length, loadavg_1m: fixed(os.loadavg()[0], 2) },
    };
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}
