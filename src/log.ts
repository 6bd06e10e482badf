// pino logger: JSON lines to stderr; human-readable when stderr is a terminal.
import pino from 'pino';

export type Logger = pino.Logger;

export function createLogger(name: string, level: string = process.env.WAVEBUS_LOG_LEVEL ?? 'info'): Logger {
  if (process.stderr.isTTY) {
    return pino({ name, level, transport: { target: 'pino-pretty', options: { destination: 2, colorize: true } } });
  }
  return pino({ name, level }, pino.destination({ dest: 2, sync: true }));
}
