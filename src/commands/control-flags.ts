// The flags every control command (`wavebus status / dump / capture`) shares: where the coordinator
// is and how to authenticate to it, as `wavebus aggregate` takes them, and the bound on the whole
// command. One way to run a command against it and end: a line naming what went wrong, and an exit
// status by kind (2 a bad argument, 3 no answer / the job ended, 1 refused or incomplete).
import { parseHostPort } from '../bus/endpoints';
import { loadBusToken } from '../bus/auth';
import { CURVE_CLIENT_FLAGS, curveClientKeysFromFlags } from '../bus/curve-client-flags';
import { ConfigError, WavebusError } from '../errors';
import { ControlClient } from '../tools/control-client';
import { msFlag } from './flags';

export const CONTROL_FLAGS = {
  coordinator: { type: 'string', demandOption: true, describe: 'the coordinator HOST:PORT (its ROUTER is PORT+1)' },
  'bus-token-file': { type: 'string', describe: "the job's bus token file, when its coordinator has one (default $WAVEBUS_BUS_TOKEN_FILE; `wavebus launch` sets it for its command)" },
  ...CURVE_CLIENT_FLAGS,
  timeout: { type: 'string', describe: 'milliseconds the whole command may take, waits included (default 5000; 120000 with --wait)' },
} as const;

const EXIT_NO_ANSWER = new Set(['ERR_TIMEOUT', 'ERR_HANDSHAKE', 'ERR_JOB_ENDED']);

/**
 * Parse the shared flags (and `check` the command's own: before any socket), connect, run `fn` with
 * the client and the command's deadline (Date.now() ms), and exit with what it returns.
 */
export async function runControl<T>(name: string, argv: Record<string, unknown>, check: () => T, fn: (client: ControlClient, opts: T, deadline: number) => Promise<number>): Promise<never> {
  let client: ControlClient | undefined;
  let code: number;
  try {
    const coordinator = parseHostPort(String(argv.coordinator), '--coordinator');
    const timeoutMs = argv.timeout === undefined ? (argv.wait ? 120000 : 5000) : msFlag(argv.timeout, '--timeout', 1);
    const opts = check();
    const deadline = Date.now() + timeoutMs;
    client = new ControlClient({ coordinator, busToken: loadBusToken(argv['bus-token-file'], process.env), curve: curveClientKeysFromFlags(argv) });
    await client.probe(timeoutMs);
    code = await fn(client, opts, deadline);
  } catch (e) {
    const c = e instanceof WavebusError ? e.code : '';
    process.stderr.write(`wavebus ${name}: ${(e as Error).message}${c ? ` [${c}]` : ''}\n`);
    code = e instanceof ConfigError ? 2 : EXIT_NO_ANSWER.has(c) ? 3 : 1;
  }
  await client?.close().catch(() => undefined);
  process.exit(code);
}
