// `wavebus keys`: make CURVE key pairs for the bus (NAME.key, secret, 0600; NAME.pub, public),
// or print an allow-list built from a directory of *.pub files. See docs/security.md.
import * as os from 'os';
import type { CommandModule } from 'yargs';
import { allowListText, writeKeyPair } from '../bus/curve';
import { ConfigError } from '../errors';
import { lastOf } from './flags';

/** A short host name, made safe for a file name. */
function defaultName(): string {
  return os.hostname().split('.')[0].replace(/[^A-Za-z0-9._-]/g, '_').replace(/^[.-]+/, '') || 'wavebus';
}

export const command: CommandModule = {
  command: 'keys',
  describe: 'Make a CURVE key pair for the wave bus (NAME.key + NAME.pub), or print an allow-list from a directory of *.pub',
  builder: (y) =>
    y
      .option('out', { type: 'string', describe: 'directory to write NAME.key (mode 0600) and NAME.pub into (created 0700 if missing)' })
      .option('name', { type: 'string', describe: 'file name stem, e.g. coordinator, agent, a host name', defaultDescription: 'the short host name' })
      .option('allow-list', { type: 'string', describe: 'print an allow-list (one `KEY name` line per *.pub in this directory) instead' })
      .example('$0 keys --out ~/.wavebus/keys --name coordinator', 'the coordinator key pair')
      .example('$0 keys --out ~/.wavebus/keys --name agent', 'a client key pair for agents and tools')
      .example('$0 keys --allow-list ./pubs > allow.txt', 'merge collected public keys into one allow-list file'),
  handler: async (argv) => {
    // A flag given twice: its last value, as every command takes it.
    const str = (v: unknown) => (v === undefined ? undefined : String(lastOf(v)));
    const out = str(argv.out);
    const allow = str(argv['allow-list']);
    const nameFlag = str(argv.name);
    if (allow !== undefined && out !== undefined) throw new ConfigError('--allow-list and --out: give one of them');
    if (allow !== undefined) {
      if (nameFlag !== undefined) throw new ConfigError('--name applies to --out, not to --allow-list');
      process.stdout.write(allowListText(allow));
      return;
    }
    if (out === undefined || out === '') throw new ConfigError('--out DIR is required (where NAME.key and NAME.pub are written)');
    const name = nameFlag ?? defaultName();
    const r = writeKeyPair(out, name);
    process.stdout.write(`${JSON.stringify({ event: 'keys', name, public_key: r.publicKey, key_file: r.keyFile, pub_file: r.pubFile })}\n`);
  },
};
