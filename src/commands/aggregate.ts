// `wavebus aggregate`: pull every rank's bundles (through the coordinator) into one tree with a
// manifest. Exit 0 only when no expected rank or dump file is missing and every file arrived verified.
import type { CommandModule } from 'yargs';
import { DEFAULT_DIRECT_TIMEOUT_MS } from '../tools/aggregate-direct';
import { aggregate, DEFAULT_CHUNK_MB, DEFAULT_WINDOW, MAX_CHUNK_MB, MAX_REQUEST_TIMEOUT_MS, type AggregateProgress } from '../tools/aggregate';
import { parseHostPort } from '../bus/endpoints';
import { loadBusToken } from '../bus/auth';
import { CURVE_CLIENT_FLAGS, curveClientKeysFromFlags } from '../bus/curve-client-flags';
import { ConfigError, WavebusError } from '../errors';
import { keepFreedMemory } from '../malloc-tuning';
import { intFlag, msFlag, numberFlag } from './flags';

function progressBar(): ((p: AggregateProgress) => void) | undefined {
  if (!process.stderr.isTTY) return undefined;
  const t0 = Date.now();
  let last = 0;
  return (p) => {
    const now = Date.now();
    if (now - last < 100 && p.doneFiles < p.totalFiles) return;
    last = now;
    const frac = p.totalBytes > 0 ? Math.min(1, p.doneBytes / p.totalBytes) : 1;
    const width = 30;
    const bar = '#'.repeat(Math.round(frac * width)).padEnd(width, ' ');
    const mbps = p.doneBytes / 2 ** 20 / Math.max(0.001, (now - t0) / 1000);
    process.stderr.write(
      `\r[${bar}] ${(frac * 100).toFixed(0).padStart(3)}%  ${(p.doneBytes / 2 ** 20).toFixed(1)}/${(p.totalBytes / 2 ** 20).toFixed(1)} MiB  ${p.doneFiles}/${p.totalFiles} files  ${mbps.toFixed(1)} MiB/s `,
    );
  };
}

export const command: CommandModule = {
  command: 'aggregate',
  describe: 'Collect the bundles (KV dumps, snapshots) of every rank, through the coordinator, into one verified tree',
  builder: (y) =>
    y
      .option('coordinator', { type: 'string', demandOption: true, describe: 'the coordinator HOST:PORT (its ROUTER is PORT+1)' })
      .option('out', { type: 'string', demandOption: true, describe: 'output directory (DIR/dumps, DIR/snapshots, DIR/manifest.json)' })
      .option('what', { type: 'string', default: 'all', choices: ['all', 'snapshots', 'dumps'], describe: 'which roots to collect' })
      .option('prefix', { type: 'string', default: '', describe: 'relative path prefix under each root, e.g. token_repeat/req-1/wave_12 or <hash>/' })
      .option('call', { type: 'string', describe: 'snapshots: keep only call<N> directories' })
      .option('chunk-mb', { type: 'string', default: String(DEFAULT_CHUNK_MB), describe: `chunk size in MiB (at most ${MAX_CHUNK_MB})` })
      .option('window', { type: 'string', default: String(DEFAULT_WINDOW), describe: 'chunks in flight per file' })
      .option('timeout-ms', { type: 'string', default: '30000', describe: 'per relayed request' })
      .option('bus-token-file', { type: 'string', describe: 'the job\'s bus token file, when its coordinator has one (default $WAVEBUS_BUS_TOKEN_FILE; `wavebus launch` sets it for its command)' })
      .options(CURVE_CLIENT_FLAGS)
      .option('relay', { type: 'boolean', default: false, describe: 'with CURVE: fetch every chunk through the coordinator, never from the agents\' own file sockets' })
      .option('direct-timeout-ms', { type: 'string', default: String(DEFAULT_DIRECT_TIMEOUT_MS), describe: 'with CURVE: how long a rank\'s file socket has to answer before its chunks go through the coordinator' })
      .option('json', { type: 'boolean', default: false, describe: 'print the manifest as JSON on stdout' }),
  handler: async (argv) => {
    keepFreedMemory(); // multi-MiB chunk frames: reuse freed memory instead of faulting in fresh pages
    try {
      const coordinator = parseHostPort(String(argv.coordinator), '--coordinator');
      // MiB may be fractional (a chunk of 1/1024 MiB is 1 KiB); every other number is an integer flag.
      const chunkMb = numberFlag(argv['chunk-mb'], '--chunk-mb', 1 / 1024, MAX_CHUNK_MB);
      const call = argv.call === undefined ? undefined : intFlag(argv.call, '--call', 0);
      const m = await aggregate({
        coordinator,
        busToken: loadBusToken(argv['bus-token-file'], process.env),
        curve: curveClientKeysFromFlags(argv),
        out: String(argv.out),
        what: argv.what as 'all' | 'snapshots' | 'dumps',
        prefix: String(argv.prefix ?? ''),
        call,
        chunkBytes: Math.floor(chunkMb * 2 ** 20),
        window: intFlag(argv.window, '--window', 1, 64),
        // The relay adds its own margin to each request's timer: keep the sum a valid timer.
        requestTimeoutMs: msFlag(argv['timeout-ms'], '--timeout-ms', 1, MAX_REQUEST_TIMEOUT_MS),
        direct: !argv.relay,
        directTimeoutMs: msFlag(argv['direct-timeout-ms'], '--direct-timeout-ms', 1, MAX_REQUEST_TIMEOUT_MS),
        progress: progressBar(),
      });
      if (process.stderr.isTTY) process.stderr.write('\n');
      if (argv.json) {
        process.stdout.write(`${JSON.stringify(m, null, 2)}\n`);
      } else {
        const t = m.totals;
        process.stdout.write(
          `${t.files} file(s), ${t.bytes} bytes: ${t.fetched_files} fetched, ${t.present_files} already present, ${t.failed_files} failed, ${t.refused} refused\n` +
            `ranks: expected ${m.expected_ranks.join(',') || '-'}  present ${m.present_ranks.join(',') || '-'}  missing ${m.missing_ranks.join(',') || '-'}\n` +
            `manifest: ${String(argv.out)}/manifest.json\n`,
        );
      }
      for (const r of m.direct.relayed) process.stderr.write(`wavebus aggregate: rank ${r}: fetched through the coordinator, not directly (${m.ranks[String(r)]?.direct_error ?? 'no reason given'})\n`);
      for (const r of m.missing_ranks) {
        const l = m.ranks[String(r)];
        process.stderr.write(`wavebus aggregate: rank ${r} missing${l?.errors.length ? ` (${l.errors.join('; ')})` : ' (listed no files)'}\n`);
      }
      for (const f of m.files.filter((x) => x.status === 'failed')) process.stderr.write(`wavebus aggregate: ${f.root}/${f.path} failed: ${f.error}\n`);
      for (const f of m.missing_files) process.stderr.write(`wavebus aggregate: dumps/${f.path} missing (rank ${f.rank} wrote it, says ${f.dump}/manifest.json): ${f.reason}\n`);
      for (const r of m.refused) process.stderr.write(`wavebus aggregate: refused ${r.root} path ${JSON.stringify(r.path)} from rank ${r.rank}: ${r.reason}\n`);
      for (const c of m.conflicts) process.stderr.write(`wavebus aggregate: conflict on ${c.root}/${c.path}: ${c.detail}\n`);
      process.exit(m.complete ? 0 : 1);
    } catch (e) {
      process.stderr.write(`wavebus aggregate: ${(e as Error).message}\n`);
      process.exit(e instanceof ConfigError ? 2 : e instanceof WavebusError && (e.code === 'ERR_TIMEOUT' || e.code === 'ERR_HANDSHAKE') ? 3 : 1);
    }
  },
};
