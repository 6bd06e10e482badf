// `wavebus trace DIR -o job.trace.json`: the Chrome trace event format (Perfetto, chrome://tracing)
// of a tree. A process per rank with four threads (waves, engine waits, dumps, captures) from the
// ranks' timelines (src/agent/timeline.ts), incidents as instant events on their replica head's
// waves thread, and a coordinator process whose thread shows each config sent to each replica.
import * as path from 'path';
import { writeFileAtomic } from '../artifacts/atomic-write';
import { DEFAULT_FILE_MODE } from '../artifacts/artifact-mode';
import { collectTree, type ReportTree, type TimelineDoc } from './report/collect';

export interface TraceEvent {
  name: string;
  cat?: string;
  ph: 'X' | 'i' | 'M';
  ts: number;
  dur?: number;
  pid: number;
  tid: number;
  s?: 't' | 'p' | 'g';
  args?: Record<string, unknown>;
}

export interface TraceFile {
  traceEvents: TraceEvent[];
  displayTimeUnit: 'ms';
  otherData: Record<string, unknown>;
}

export const COORDINATOR_PID = 0;
export const rankPid = (g: number) => g + 1;
export const TRACE_THREADS = { waves: 1, waits: 2, dumps: 3, captures: 4 } as const;

const meta = (pid: number, tid: number, name: string, value: string | number): TraceEvent => ({ name, ph: 'M', ts: 0, pid, tid, args: name.endsWith('sort_index') ? { sort_index: value } : { name: value } });

function rankEvents(t: TimelineDoc, us: (ms: number) => number): TraceEvent[] {
  const pid = rankPid(t.rank);
  const out: TraceEvent[] = [];
  const kind = (e: number[]) => t.kinds[e[0]];
  const byStart = [...t.entries].sort((a, b) => a[2] - b[2]);
  const vectors = byStart.filter((e) => kind(e) === 'vector');
  vectors.forEach((e, i) => {
    const next = vectors[i + 1];
    // A wave here: from its vector's arrival to the next one's (the last has no end yet).
    out.push({ name: `wave ${e[1]}`, cat: 'wave', ph: 'X', ts: us(e[2]), dur: next ? Math.max(0, us(next[2]) - us(e[2])) : 0, pid, tid: TRACE_THREADS.waves, args: { wave: e[1] } });
  });
  for (const e of byStart) {
    const k = kind(e);
    if (k === 'end_of_wave') out.push({ name: `end_of_wave ${e[1]}`, cat: 'wait', ph: 'X', ts: us(e[2]), dur: Math.round(e[3] * 1000), pid, tid: TRACE_THREADS.waits, args: { wave: e[1] } });
    else if (k === 'late_vector') out.push({ name: `late vector ${e[1]}`, cat: 'late_vector', ph: 'i', s: 't', ts: us(e[2]), pid, tid: TRACE_THREADS.waits, args: { wave: e[1], meaning: 'the engine waited for this vector; it came within the bound' } });
    else if (k === 'missed_vector') out.push({ name: `missed vector ${e[1]}`, cat: 'missed_vector', ph: 'i', s: 't', ts: us(e[2]), pid, tid: TRACE_THREADS.waits, args: { wave: e[1], meaning: 'the bound ran out; the step went on without it' } });
    else if (k === 'dump') out.push({ name: `dump wave ${e[1]}`, cat: 'dump', ph: 'X', ts: us(e[2]), dur: Math.round(e[3] * 1000), pid, tid: TRACE_THREADS.dumps, args: { wave: e[1], jobs: e[4] } });
    else if (k === 'capture') out.push({ name: `capture call ${e[4]}`, cat: 'capture', ph: 'X', ts: us(e[2]), dur: Math.round(e[3] * 1000), pid, tid: TRACE_THREADS.captures, args: { global_step: e[1], call_index: e[4] } });
  }
  return out;
}

export function buildTrace(tree: ReportTree): TraceFile {
  const times: number[] = [];
  for (const t of tree.timelines) for (const e of t.entries) times.push(e[2]);
  for (const c of tree.configHistory) times.push(c[3]);
  const incidentMs = tree.incidents.map((i) => Date.parse(String(i.report.ts)));
  for (const m of incidentMs) if (Number.isFinite(m)) times.push(m);
  const crashes = tree.recorderFlushes.flatMap((f) => f.crashes.filter((c) => c.timeMs !== null && c.rank >= 0).map((c) => ({ ...c, dir: f.dir })));
  for (const c of crashes) times.push(c.timeMs!);
  const t0 = times.length ? Math.min(...times) : 0;
  const us = (ms: number) => Math.round((ms - t0) * 1000);
  const events: TraceEvent[] = [meta(COORDINATOR_PID, 0, 'process_name', 'coordinator'), meta(COORDINATOR_PID, 0, 'process_sort_index', 0), meta(COORDINATOR_PID, 0, 'thread_name', 'config changes')];
  const named = new Set<number>();
  const nameRank = (g: number, host?: string): void => {
    if (named.has(g)) return;
    named.add(g);
    const pid = rankPid(g);
    events.push(meta(pid, 0, 'process_name', `rank ${g}${host ? ` (${host})` : ''}`), meta(pid, 0, 'process_sort_index', pid));
    for (const [name, tid] of Object.entries(TRACE_THREADS)) events.push(meta(pid, tid, 'thread_name', name));
  };
  for (const t of tree.timelines) {
    nameRank(t.rank, t.host);
    events.push(...rankEvents(t, us));
  }
  for (const c of [...tree.configHistory].sort((a, b) => a[3] - b[3])) {
    events.push({ name: `config v${c[2]} to dp${c[0]}`, cat: 'config', ph: 'i', s: 't', ts: us(c[3]), pid: COORDINATOR_PID, tid: 0, args: { replica: c[0], applies_at_wave: c[1], config_version: c[2] } });
  }
  tree.incidents.forEach((inc, i) => {
    if (!Number.isFinite(incidentMs[i])) return;
    const g = Number.isSafeInteger(inc.report.rank) ? Number(inc.report.rank) : 0;
    nameRank(g);
    events.push({ name: `${inc.type} ${String(inc.report.req_id)}`, cat: 'incident', ph: 'i', s: 't', ts: us(incidentMs[i]), pid: rankPid(g), tid: TRACE_THREADS.waves, args: { incident_type: inc.type, req_id: inc.report.req_id, detect_wave: inc.report.detect_wave, dump_arm_wave: inc.report.dump_arm_wave, report: inc.file } });
  });
  // An engine death its agent recorded (crash-rank<g>.json): when the agent noticed it.
  for (const c of crashes) {
    nameRank(c.rank);
    events.push({ name: `engine crash${c.signal ? ` (${c.signal})` : ''}`, cat: 'crash', ph: 'i', s: 'p', ts: us(c.timeMs!), pid: rankPid(c.rank), tid: TRACE_THREADS.waves, args: { last_wave: c.lastWave, exit_code: c.exitCode, signal: c.signal, exception: c.exception, left_out: c.leftOut, record: c.file } });
  }
  // Metadata first, then by time: each track's events in order.
  events.sort((a, b) => (a.ph === 'M' ? 0 : 1) - (b.ph === 'M' ? 0 : 1) || a.ts - b.ts);
  return {
    traceEvents: events,
    displayTimeUnit: 'ms',
    otherData: { generator: 'wavebus trace', tree: tree.root, start_unix_ms: t0, ranks: tree.timelines.map((t) => t.rank), overwritten: Object.fromEntries(tree.timelines.filter((t) => t.overwritten).map((t) => [t.rank, t.overwritten])) },
  };
}

export function writeTrace(dir: string, out: string): { file: string; events: number; ranks: number; skipped: string[] } {
  const tree = collectTree(dir, { verify: false });
  const t = buildTrace(tree);
  writeFileAtomic(path.resolve(out), JSON.stringify(t), { mode: DEFAULT_FILE_MODE });
  // Files left out of the trace (too deep, too big, not what their name says), each with why.
  return { file: out, events: t.traceEvents.length, ranks: tree.timelines.length, skipped: tree.unreadable };
}
