// When each replica got each runtime config (the wave it applies at, the time it was sent), for
// the coordinator's track in `wavebus trace`. Bounded (the newest MAX_ENTRIES), written beside the
// ranks' timelines as `<dump_root>/timeline/coordinator.json`, atomically and off the wave path
// (the next turn of the event loop): configs change rarely, the first of each replica at its first head.
import * as fs from 'fs';
import * as path from 'path';
import { writeFileAtomic } from '../artifacts/atomic-write';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';
import { TIMELINE_DIR } from '../paths';
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

  private unwritten = false;
  private root?: string;

  record(replica: number, wave: number, version: number, dumpRoot: string): void {
    this.entries.push([replica, wave, version, Date.now()]);
    this.unwritten = true;
    this.root = dumpRoot;
    if (this.entries.length > MAX_ENTRIES) this.entries.shift();
    this.pending ??= setImmediate(() => {
      this.pending = undefined;
      this.write(dumpRoot);
    });
  }

  private write(dumpRoot: string): void {
    // As the ranks' timelines: the root is made if need be, never where its parent is gone.
    if (!fs.existsSync(path.dirname(dumpRoot))) return;
    try {
      mkdirTrustedSync(path.join(dumpRoot, TIMELINE_DIR), this.modes.dir, 'wave timeline directory');
      const doc = { kind: 'wavebus_config_history', version: 1, fields: ['replica', 'wave', 'config_version', 'sent_ms'], entries: this.entries };
      writeFileAtomic(path.join(dumpRoot, TIMELINE_DIR, 'coordinator.json'), `${JSON.stringify(doc)}\n`, { mode: this.modes.file });
      this.unwritten = false;
    } catch (e) {
      this.log.warn({ err: (e as Error).message }, 'could not write the config history');
    }
  }

  /** A write still due, or one skipped because the root's parent did not exist yet, is done now. */
  close(): void {
    if (this.pending) clearImmediate(this.pending);
    this.pending = undefined;
    if (this.unwritten && this.root !== undefined) this.write(this.root);
  }
}
