// When each replica got each runtime config (the wave it applies at, the time it was sent), for
// the coordinator's track in `wavebus trace`. Bounded (the newest MAX_ENTRIES), written beside the
// ranks' timelines as `<dump_root>/timeline/coordinator.json`, atomically and off the wave path
// (the next turn of the event loop): configs change rarely, the first of each replica at its first head.
import * as fs from 'fs';
import * as path from 'path';
import { writeFileAtomic } from '../artifacts/atomic-write';
import type { ArtifactModes } from '../artifacts/artifact-mode';
import type { Logger } from '../log';

const MAX_ENTRIES = 1024;

export class ConfigHistory {
  /** [replica, wave, version, unix ms] */
  private readonly entries: number[][] = [];
  private pending?: NodeJS.Immediate;

  constructor(
    private readonly modes: ArtifactModes,
    private readonly log: Logger,
  ) {}

  record(replica: number, wave: number, version: number, dumpRoot: string): void {
    this.entries.push([replica, wave, version, Date.now()]);
    if (this.entries.length > MAX_ENTRIES) this.entries.shift();
    this.pending ??= setImmediate(() => {
      this.pending = undefined;
      this.write(dumpRoot);
    });
  }

  /** Only under a dump root that exists (a job's root removed under it is not made again). */
  private write(dumpRoot: string): void {
    try {
      if (!fs.existsSync(dumpRoot)) return;
      const dir = path.join(dumpRoot, 'timeline');
      fs.mkdirSync(dir, { mode: this.modes.dir, recursive: false });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') return void this.log.warn({ err: (e as Error).message }, 'could not write the config history');
    }
    try {
      const doc = { kind: 'wavebus_config_history', version: 1, fields: ['replica', 'wave', 'config_version', 'sent_ms'], entries: this.entries };
      writeFileAtomic(path.join(dumpRoot, 'timeline', 'coordinator.json'), `${JSON.stringify(doc)}\n`, { mode: this.modes.file });
    } catch (e) {
      this.log.warn({ err: (e as Error).message }, 'could not write the config history');
    }
  }

  /** A write still due is dropped (the guard is closing; its root may be going away). */
  close(): void {
    if (this.pending) clearImmediate(this.pending);
    this.pending = undefined;
  }
}
