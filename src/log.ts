// pino logger: JSON lines to stderr; human-readable when stderr is a terminal.
import pino from 'pino';
import { ConfigError } from './errors';

export type Logger = pino.Logger;

/** The level from WAVEBUS_LOG_LEVEL (default info); a name pino does not know is an error naming the variable. */
export function envLogLevel(env: NodeJS.ProcessEnv = process.env): string {
  const v = env.WAVEBUS_LOG_LEVEL;
  if (v === undefined || v === '') return 'info';
  const known = Object.keys(pino.levels.values);
  if (!known.includes(v)) throw new ConfigError(`WAVEBUS_LOG_LEVEL: expected one of ${known.join(', ')}, got ${JSON.stringify(v)}`);
  return v;
}

export function createLogger(name: string, level: string = envLogLevel()): Logger {
  if (process.stderr.isTTY) {
    return pino({ name, level, transport: { target: 'pino-pretty', options: { destination: 2, colorize: true } } });
  }
  return pino({ name, level }, pino.destination({ dest: 2, sync: true }));
}
