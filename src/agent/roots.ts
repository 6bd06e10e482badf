// Where an agent may write and what it may serve are local decisions: the roots its own host's
// flags and configuration name (--dump-root, the snapshot cache root). A directory that arrives
// over the bus (the config lane's dump.dump_dir, a DumpJob's dump_dir) may only narrow them: it
// must name the local root itself or a directory below it, by its text alone. Links inside the
// root are the file server's and the bundle writer's business (they open without following them).
import * as path from 'path';
import { RootRefusedError } from '../errors';
import type { Logger } from '../log';
import { checkTrustedPathSync } from '../artifacts/safe-mkdir';

/** The roots this agent writes and serves under. An absent root is neither written nor served. */
export interface LocalRoots {
  dumps?: string;
  snapshots?: string;
}

/**
 * Refuse to start with a root another user could plant links or directories in (a component
 * owned by another user, or writable by all without the sticky bit): UntrustedPathError naming
 * the path and its owner. `snapshots` is checked only when capture is on.
 */
export function checkLocalRoots(roots: LocalRoots, snapshotsOn: boolean): void {
  if (roots.dumps !== undefined) checkTrustedPathSync(roots.dumps, '--dump-root', 'dir');
  if (snapshotsOn && roots.snapshots !== undefined) checkTrustedPathSync(roots.snapshots, 'snapshot root', 'dir');
}

/**
 * `fromBus` if it is `local` or below it, as text: absolute, no NUL, no '.' or '..' component.
 * Throws RootRefusedError naming both otherwise.
 */
export function narrowRoot(local: string, fromBus: string, what: string): string {
  const shown = JSON.stringify(fromBus.slice(0, 512));
  const refuse = (why: string): never => {
    throw new RootRefusedError(`${what} ${shown} refused: ${why} (the local dump root is ${JSON.stringify(local)})`);
  };
  if (fromBus.includes('\0')) refuse('it contains NUL');
  if (!path.isAbsolute(fromBus)) refuse('not an absolute path');
  const parts = fromBus.split('/').filter((p) => p !== '');
  if (parts.some((p) => p === '.' || p === '..')) refuse("it has a '.' or '..' component");
  const base = path.resolve(local).split('/').filter((p) => p !== '');
  if (parts.length < base.length || base.some((p, i) => parts[i] !== p)) refuse('outside the local dump root');
  return '/' + parts.join('/');
}

/**
 * The dump root gate of one agent: checks bus roots against the local one, counts refusals by
 * path and logs each refused path once.
 */
export class RootGate {
  /** Refusals of a bus root, in all. */
  refused = 0;
  private readonly logged = new Set<string>();

  constructor(
    private readonly rank: number,
    readonly local: LocalRoots,
    private readonly log: Logger,
  ) {}

  /** The directory to write or serve for a bus root; throws RootRefusedError (counted, logged once per path). */
  dumpDir(fromBus: string, what: string): string {
    try {
      if (this.local.dumps === undefined) {
        throw new RootRefusedError(`${what} ${JSON.stringify(fromBus.slice(0, 512))} refused: rank ${this.rank} has no local dump root (--dump-root)`);
      }
      return narrowRoot(this.local.dumps, fromBus, what);
    } catch (e) {
      this.refused++;
      const key = `${what}\0${fromBus}`;
      if (!this.logged.has(key) && this.logged.size < 1024) {
        this.logged.add(key);
        this.log.warn({ rank: this.rank, refused: fromBus.slice(0, 512), localRoot: this.local.dumps ?? null, total: this.refused }, `refused a dump root from the bus: ${(e as Error).message}`);
      }
      throw new RootRefusedError(`rank ${this.rank}: ${(e as Error).message}`);
    }
  }

  /** The dumps root to serve: the bus's when it narrows the local one, else the local one. */
  servedDumps(fromBus: string | undefined): string | undefined {
    if (fromBus === undefined || this.local.dumps === undefined) return this.local.dumps;
    try {
      return this.dumpDir(fromBus, 'dump.dump_dir');
    } catch {
      return this.local.dumps;
    }
  }
}
