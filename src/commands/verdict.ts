// `wavebus verdict TREE`: device or software? Replays an incident's recorded forwards on the rank's
// own host, on another holding the same shard, and at TP=1, and writes the verdict
// (<incident flush>/verdict.json). Exit 0 with a verdict (any of the four), 2 on bad input.
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { ConfigError, WavebusError } from '../errors';
import { intFlag, msFlag, nonEmpty } from './flags';
import { parseTolerances } from './bisect';
import { jsonSafe } from '../tools/compare';
import { parseHostEnvs, parseRankHosts } from '../tools/verdict-plan';
import { formatVerdict, verdict, writeVerdict } from '../tools/verdict';
import { reportVerdict } from '../tools/verdict-report';
import { runReplayRequest } from '../tools/verdict-remote';
import { DEFAULT_TOLERANCES } from '../tools/bisect-compare';
import { parseHostPort } from '../bus/endpoints';
import { loadBusToken } from '../bus/auth';
import { CURVE_CLIENT_FLAGS, curveClientKeysFromFlags } from '../bus/curve-client-flags';

const REPLAY = path.join(__dirname, '..', '..', '..', 'examples', 'torch-engine', 'replay.py');
const list = (v: unknown): string[] => (v === undefined ? [] : Array.isArray(v) ? v.map(String) : [String(v)]);

export const command: CommandModule = {
  command: 'verdict <tree>',
  describe: "Device or software? Replay an incident's recorded forwards on its host, on another holding the same shard, and at TP=1: deterministic | device-local | transient | inconclusive",
  builder: (y) =>
    y
      .positional('tree', { type: 'string', demandOption: true, describe: 'a tree holding recorder/incident-wave<w>[-dp<r>]/ (cache root, snapshot root, aggregated tree)' })
      .option('incident', { type: 'string', describe: 'the flush folder to judge (incident-wave<w>[-dp<r>], crash-<run>, flush-capture-<n>); default: the only incident flush' })
      .option('engine-out', { type: 'string', describe: "where the engine saved what it computed (the torch example's --out: forward_rank<g>_step<S>.pt, pid_rank<g>)" })
      .option('dp', { type: 'string', default: '1', describe: 'DP replicas of the job (global rank = replica * tp + tp rank)' })
      .option('rank-host', { type: 'string', array: true, nargs: 1, describe: 'G=HOST[:DEVICE], repeatable: where rank G ran (default host local, device G)' })
      .option('host-env', { type: 'string', array: true, nargs: 1, describe: 'HOST=FILE, repeatable: KEY=VALUE lines a replay "on HOST" runs with (replays run here, as local processes)' })
      .option('other-host', { type: 'string', describe: "replay (2) on this host, same device indices, instead of another replica: with --coordinator, by the agent of a rank --rank-host places there; else here with the host's --host-env" })
      .option('allow-live-device', { type: 'boolean', default: false, describe: "replay on a device whose engine still serves (CPU: share the engine's cores)" })
      .option('reference', { type: 'boolean', default: true, describe: 'when it reproduces everywhere, replay at TP=1 with the probe on and bisect (--no-reference: skip)' })
      .option('python', { type: 'string', default: 'python3', describe: 'the Python the replayer runs under' })
      .option('replayer', { type: 'string', describe: `the engine's replay script (default ${path.relative(process.cwd(), REPLAY) || REPLAY})` })
      .option('replayer-arg', { type: 'string', array: true, nargs: 1, describe: 'an argument for every replay, repeatable (the torch example: --shard-patch FILE)' })
      .option('tol', { type: 'string', array: true, nargs: 1, describe: "DTYPE=ATOL,RTOL, repeatable (bisect's; defaults fp32=1e-5,1e-4 ...)" })
      .option('replay-timeout-ms', { type: 'string', default: '600000', describe: 'each replay process is killed after this long (the verdict is then inconclusive)' })
      .option('json', { type: 'boolean', default: false, describe: 'print verdict.json' })
      .option('replay-request', { type: 'boolean', default: false, describe: "an agent's replay for another host's verdict: TREE is the request it wrote (request.json, snapshots/, engine/); prints the replay's per-tensor errors as JSON (docs/verdict.md)" })
      .option('coordinator', { type: 'string', describe: "also tell the job's coordinator HOST:PORT (its status and /metrics show the verdict)" })
      .option('bus-token-file', { type: 'string', describe: "with --coordinator: the job's bus token file (default $WAVEBUS_BUS_TOKEN_FILE)" })
      .option('bus-token-fd', { type: 'string', describe: 'with --coordinator: read the bus token from this descriptor (how verdict.auto\'s agent hands it on; takes the place of --bus-token-file)' })
      .options(CURVE_CLIENT_FLAGS)
      .option('timeout', { type: 'string', default: '5000', describe: 'with --coordinator: milliseconds to wait for its answer' }),
  handler: async (argv) => {
    const fail = (e: unknown) => {
      process.stderr.write(`wavebus verdict: ${(e as Error).message}\n`);
      process.exit(2);
    };
    try {
      // The coordinator's flags are checked before any replay runs.
      const target = argv.coordinator === undefined ? undefined : {
        coordinator: parseHostPort(String(argv.coordinator), '--coordinator'),
        busToken: loadBusToken(argv['bus-token-file'], process.env, argv['bus-token-fd']),
        curve: curveClientKeysFromFlags(argv),
      };
      const timeoutMs = msFlag(argv.timeout, '--timeout', 1);
      const replayer = [nonEmpty(argv.python, '--python'), argv.replayer === undefined ? REPLAY : path.resolve(nonEmpty(argv.replayer, '--replayer'))];
      if (argv['replay-request']) {
        // The agent's child (src/agent/replay-server.ts): this host's replayer, shard and engines.
        const r = await runReplayRequest(path.resolve(nonEmpty(argv.tree, 'TREE')), {
          replayer, replayerArgs: list(argv['replayer-arg']), tolerances: { ...DEFAULT_TOLERANCES, ...parseTolerances(argv.tol) },
          servingOut: argv['engine-out'] === undefined ? undefined : path.resolve(nonEmpty(argv['engine-out'], '--engine-out')),
        });
        process.stdout.write(`${JSON.stringify(jsonSafe(r))}\n`);
        process.exit(0);
      }
      if (argv['engine-out'] === undefined) throw new ConfigError("--engine-out: required: the engine's own outputs are what each replay is compared with");
      const v = await verdict({
        tree: path.resolve(nonEmpty(argv.tree, 'TREE')),
        incident: argv.incident === undefined ? undefined : nonEmpty(argv.incident, '--incident'),
        engineOut: path.resolve(nonEmpty(argv['engine-out'], '--engine-out')),
        replayer,
        replayerArgs: list(argv['replayer-arg']),
        dp: intFlag(argv.dp, '--dp', 1, 4096),
        hosts: parseRankHosts(list(argv['rank-host'])),
        hostEnvs: parseHostEnvs(list(argv['host-env'])),
        otherHost: argv['other-host'] === undefined ? undefined : nonEmpty(argv['other-host'], '--other-host'),
        allowLiveDevice: Boolean(argv['allow-live-device']),
        reference: argv.reference !== false,
        tolerances: parseTolerances(argv.tol),
        timeoutMs: msFlag(argv['replay-timeout-ms'], '--replay-timeout-ms'),
        remote: target ? { target, tol: list(argv.tol) } : undefined,
      });
      const file = writeVerdict(v);
      process.stdout.write(argv.json ? `${JSON.stringify(jsonSafe(v), null, 2)}\n` : `${formatVerdict(v)}  written: ${file}\n`);
      if (target) {
        try {
          await reportVerdict(target, v, timeoutMs);
        } catch (e) {
          // The verdict stands (written); only the coordinator does not know it: exit 3 (no answer) or 1 (refused).
          const c = e instanceof WavebusError ? e.code : '';
          process.stderr.write(`wavebus verdict: ${file} written, but the coordinator was not told: ${(e as Error).message}${c ? ` [${c}]` : ''}\n`);
          process.exit(['ERR_TIMEOUT', 'ERR_HANDSHAKE'].includes(c) ? 3 : 1);
        }
      }
      process.exit(0);
    } catch (e) {
      fail(e);
    }
  },
};
