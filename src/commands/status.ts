// `wavebus status`: what a running job is doing, from its coordinator (docs/control.md).
import type { CommandModule } from 'yargs';
import { renderStatus } from '../tools/status-table';
import { CONTROL_FLAGS, runControl } from './control-flags';
import { msFlag } from './flags';

export const command: CommandModule = {
  command: 'status',
  describe: "Show a running job's layout, waves, ranks, config, incidents, dumps and captures (from its coordinator)",
  builder: (y) =>
    y
      .options(CONTROL_FLAGS)
      .option('json', { type: 'boolean', default: false, describe: 'print one JSON document (the coordinator\'s status) instead of the table' })
      .option('watch', { type: 'boolean', default: false, describe: 'refresh until interrupted (Ctrl-C) or the coordinator goes away' })
      .option('interval', { type: 'string', default: '1000', describe: 'with --watch: milliseconds between refreshes' }),
  handler: (argv) =>
    runControl('status', argv, () => ({ interval: msFlag(argv.interval, '--interval', 100) }), async (client, { interval }, deadline) => {
      const timeoutMs = Math.max(1, deadline - Date.now());
      for (;;) {
        const r = await client.request({ status: {} }, timeoutMs);
        const doc = JSON.parse(String(r.statusJson));
        const out = argv.json ? `${JSON.stringify(doc, null, argv.watch ? undefined : 2)}\n` : renderStatus(doc, client.endpoint);
        // --watch on a terminal: redraw in place; else one document (or table) after another.
        if (argv.watch && !argv.json && process.stdout.isTTY) process.stdout.write('\x1b[H\x1b[2J');
        process.stdout.write(out);
        if (!argv.watch) return 0;
        await new Promise((res) => setTimeout(res, interval));
      }
    }),
};
