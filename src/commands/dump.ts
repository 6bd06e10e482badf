// `wavebus dump`: a manual KV dump on a running job, armed at each replica's next wave head as a
// raise of dump.manual_dump is (docs/control.md, docs/runtime-guard.md).
import * as path from 'path';
import type { CommandModule } from 'yargs';
import { ConfigError } from '../errors';
import { pollUntil } from '../tools/control-client';
import { CONTROL_FLAGS, runControl } from './control-flags';
import { intFlag, nonEmpty } from './flags';

type Progress = { replicas: number[]; replicasArmed: number[]; jobs: Record<string, any>[]; unserved?: string[]; waiting?: string[] };

export const command: CommandModule = {
  command: 'dump',
  describe: 'Arm a manual KV dump of one request (--request) or of every running one (--all) at the next wave',
  builder: (y) =>
    y
      .options(CONTROL_FLAGS)
      .option('request', { type: 'string', describe: 'the request id (matched as vLLM does: "abc" also matches "abc-<suffix>")' })
      .option('all', { type: 'boolean', default: false, describe: 'every running request' })
      .option('replica', { type: 'string', describe: 'only this DP replica (default: every replica)' })
      .option('wait', { type: 'boolean', default: false, describe: "wait for the dumps' manifests and print their paths; exit 0 only if every expected rank wrote its bundle" }),
  handler: (argv) =>
    runControl(
      'dump',
      argv,
      () => {
        if ((argv.request !== undefined) === Boolean(argv.all)) throw new ConfigError('--request / --all: give exactly one of them');
        const request = argv.request === undefined ? '' : nonEmpty(argv.request, '--request');
        const replica = argv.replica === undefined ? undefined : intFlag(argv.replica, '--replica', 0);
        return { request, replica };
      },
      async (client, o, deadline) => {
        const ask = { requestId: o.request, all: !o.request, hasReplica: o.replica !== undefined, replica: o.replica ?? 0 };
        const { id } = await client.request({ dump: ask }, Math.max(1, deadline - Date.now()));
        process.stdout.write(`armed ${id}: a manual dump of ${o.request ? `request ${o.request}` : 'every running request'} at the next wave of ${o.replica === undefined ? 'every replica' : `replica ${o.replica}`}\n`);
        if (!argv.wait) return 0;
        // A replica that could not take it (no wave head after the wake) is settled too: said below.
        const settled = (p: Progress) => p.replicasArmed.length + (p.unserved?.length ?? 0) === p.replicas.length && p.jobs.every((j) => j.settled);
        const { value: p, timedOut } = await pollUntil(client, async (t) => (await client.request({ query: { id } }, t)).dump as Progress, settled, deadline, `waiting for ${id}`);
        let ok = !timedOut && p.jobs.length > 0 && (p.unserved?.length ?? 0) === 0;
        for (const why of p.unserved ?? []) process.stderr.write(`wavebus dump: ${id} not served on ${why}\n`);
        for (const j of p.jobs) {
          if (j.skippedReason) process.stdout.write(`skipped (${j.skippedReason}): ${path.join(j.dir, 'dump_skipped.json')}\n`);
          else process.stdout.write(`${j.complete ? 'complete' : j.settled ? 'incomplete' : 'pending'}: ${path.join(j.dir, 'manifest.json')}${j.settled && !j.complete ? ` (completed ranks ${(j.completedRanks ?? []).join(',') || '-'} of ${(j.expectedRanks ?? []).join(',')})` : ''}\n`);
          if (!j.complete) ok = false;
        }
        if (timedOut) {
          process.stderr.write(`wavebus dump: --timeout ran out before every dump of ${id} settled; it stays armed\n`);
          for (const why of p.waiting ?? []) process.stderr.write(`wavebus dump: ${id} waits on ${why}\n`);
        }
        return ok ? 0 : 1;
      },
    ),
};
