// An incident's verdict in its incident report (docs/verdict.md "In the incident report"): the
// guard remembers the reports it wrote whose dump caused a recorder flush, by the flush's name;
// when a verdict on that flush reaches the coordinator (a checked VerdictNote), the report is
// written again, whole, with `verdict` added. Bounded: the newest reports only.
import type { ArtifactModes } from '../artifacts/artifact-mode';
import { artifactWrite, writeJsonAtomic } from '../artifacts/atomic-write';
import type { IncidentReport } from './reports';

/** What a report gains: the coordinator's record of the note (already checked and bounded). */
export interface ReportVerdict {
  incident: string;
  verdict: string;
  host: string;
  devices: number[];
  replica: number;
  ranks: number[];
  reason: string;
  bisect_module: string | null;
  fingerprint: string | null;
  time: string;
}

/** Reports remembered for a verdict to find (an older one is forgotten: its verdict stays in status and /metrics). */
const REMEMBERED = 256;

export class ReportVerdicts {
  private readonly byFlush = new Map<string, { file: string; report: IncidentReport & { verdict?: ReportVerdict }; modes: ArtifactModes }>();

  /** A report written at `file` (with `modes`); one that names a recorder flush is kept for its verdict. */
  remember(report: IncidentReport, file: string, modes: ArtifactModes): void {
    const dir = report.recorder_flush?.dir;
    if (!dir) return;
    const flush = dir.slice(dir.lastIndexOf('/') + 1);
    this.byFlush.delete(flush);
    this.byFlush.set(flush, { file, report, modes });
    if (this.byFlush.size > REMEMBERED) this.byFlush.delete(this.byFlush.keys().next().value as string);
  }

  /** The report of `v.incident` rewritten with the verdict; its path, or undefined when no report names that flush. Throws when the write fails. */
  attach(v: ReportVerdict): string | undefined {
    const r = this.byFlush.get(v.incident);
    if (!r) return undefined;
    r.report.verdict = v;
    writeJsonAtomic(r.file, r.report, artifactWrite(r.modes));
    return r.file;
  }
}
