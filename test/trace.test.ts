// `wavebus trace`: the Chrome trace event file of a real job's tree (the in-process harness,
// TP=2 × DP=2), checked against the trace-event format (the fields each phase needs, time in
// order on every track) and its counts against the tree: a wave per vector each rank's agent
// recorded, a dump slice per rank dump written, an instant per incident report, the config sent
// to each replica on the coordinator's track.
import * as fs from 'fs';
import * as path from 'path';
import { cleanup, runWavebus, tmpDir, waitFor } from './helpers';
import { WaveTimeline, TIMELINE_WRITE_GAP_MS, timelineFile } from '../src/agent/timeline';
import type { RankIdentity } from '../src/layout';
import type { ArtifactModes } from '../src/artifacts/artifact-mode';
import type { Logger } from '../src/log';
import { realJobTree, type JobTree } from './report-trees';

jest.setTimeout(180000);

let tree: JobTree;
const work = tmpDir('wavebus-trace-');
beforeAll(async () => {
  tree = await realJobTree();
});
afterAll(() => cleanup());

interface Ev {
  name: string;
  ph: string;
  ts: number;
  dur?: number;
  pid: number;
  tid: number;
  s?: string;
  cat?: string;
  args?: Record<string, any>;
}

/** The trace-event format's rules for the phases we write (Trace Event Format, Google). */
function checkFormat(events: Ev[]): void {
  const last = new Map<string, number>();
  for (const e of events) {
    expect(typeof e.name).toBe('string');
    expect(['X', 'i', 'M']).toContain(e.ph);
    expect(Number.isInteger(e.pid) && Number.isInteger(e.tid)).toBe(true);
    expect(Number.isFinite(e.ts) && e.ts >= 0).toBe(true);
    if (e.ph === 'X') expect(Number.isFinite(e.dur) && e.dur! >= 0).toBe(true);
    if (e.ph === 'i') expect(['t', 'p', 'g']).toContain(e.s);
    if (e.ph === 'M') {
      expect(['process_name', 'thread_name', 'process_sort_index']).toContain(e.name);
      expect(e.args).toBeDefined();
      continue;
    }
    const track = `${e.pid}/${e.tid}`;
    expect(e.ts).toBeGreaterThanOrEqual(last.get(track) ?? 0);
    last.set(track, e.ts);
  }
  // Complete slices on one track never overlap partly (each track is one thread's stack).
  const byTrack = new Map<string, Ev[]>();
  for (const e of events.filter((x) => x.ph === 'X')) byTrack.set(`${e.pid}/${e.tid}`, [...(byTrack.get(`${e.pid}/${e.tid}`) ?? []), e]);
  for (const list of byTrack.values()) for (let i = 1; i < list.length; i++) expect(list[i].ts).toBeGreaterThanOrEqual(list[i - 1].ts + list[i - 1].dur!);
}

test('a real job: the trace-event format, a track per rank and the coordinator, counts as in the tree', () => {
  const out = path.join(work, 'job.trace.json');
  const r = runWavebus(['trace', tree.root, '-o', out]);
  expect(r.code).toBe(0);
  expect(r.stdout).toMatch(/events, 4 rank\(s\)/);
  expect(fs.statSync(out).mode & 0o777).toBe(0o640);
  const t = JSON.parse(fs.readFileSync(out, 'utf8'));
  expect(t.displayTimeUnit).toBe('ms');
  const events = t.traceEvents as Ev[];
  checkFormat(events);

  const timelineDir = path.join(tree.dumpRoot, 'timeline');
  const timelines = fs.readdirSync(timelineDir).filter((f) => /^rank\d+\.json$/.test(f)).map((f) => JSON.parse(fs.readFileSync(path.join(timelineDir, f), 'utf8')));
  expect(timelines.map((x) => x.global_rank).sort()).toEqual([0, 1, 2, 3]);
  // Written like the other artifacts: never world-readable.
  for (const f of fs.readdirSync(timelineDir)) expect(fs.statSync(path.join(timelineDir, f)).mode & 0o007).toBe(0);

  const names = events.filter((e) => e.ph === 'M' && e.name === 'process_name').map((e) => e.args!.name);
  expect(names).toEqual(expect.arrayContaining(['coordinator', 'rank 0 (' + timelines[0].identity.host + ')']));
  const vectors = new Map<number, number[]>();
  for (const tl of timelines) {
    const pid = tl.global_rank + 1;
    const mine = events.filter((e) => e.pid === pid && e.ph !== 'M');
    const kinds = tl.kinds as string[];
    const n = (k: string) => (tl.entries as number[][]).filter((e) => kinds[e[0]] === k).length;
    // Every rank saw the vectors of its replica's waves with work (the dump's, at least); the
    // host receiver saw every one (below).
    expect(n('vector')).toBeGreaterThanOrEqual(1);
    const replica = Math.floor(tl.global_rank / 2);
    vectors.set(replica, [...(vectors.get(replica) ?? []), n('vector')]);
    expect(mine.filter((e) => e.cat === 'wave').length).toBe(n('vector'));
    expect(mine.filter((e) => e.cat === 'wait').length).toBe(n('end_of_wave'));
    expect(mine.filter((e) => e.cat === 'late_vector').length).toBe(n('late_vector'));
    // One dump per replica, copied by its 2 ranks: each of them wrote it once.
    const dumps = mine.filter((e) => e.cat === 'dump');
    expect(dumps.length).toBe(1);
    expect(dumps[0].args!.jobs).toBe(1);
    expect(dumps[0].dur).toBeGreaterThan(0);
  }
  // Each replica's host receiver (one of its 2 ranks on this host) wrote every wave's vector of
  // the replica: 9 heads, decided ahead (more vectors than heads).
  for (const counts of vectors.values()) expect(Math.max(...counts)).toBeGreaterThanOrEqual(9);
  const dumpSlices = events.filter((e) => e.cat === 'dump').reduce((s, e) => s + e.args!.jobs, 0);
  const rankDumps = fs.readdirSync(path.join(tree.dumpRoot, 'logits_finite')).flatMap((req) => fs.readdirSync(path.join(tree.dumpRoot, 'logits_finite', req)).flatMap((w) => fs.readdirSync(path.join(tree.dumpRoot, 'logits_finite', req, w)).filter((d) => d.startsWith('dp'))));
  expect(dumpSlices).toBe(rankDumps.length);

  // Incidents: an instant each, on the track of the replica head the report names.
  const reportDir = path.join(path.dirname(tree.dumpRoot), 'logits_finite');
  const reports = fs.readdirSync(reportDir).map((f) => JSON.parse(fs.readFileSync(path.join(reportDir, f), 'utf8')));
  const incidents = events.filter((e) => e.cat === 'incident');
  expect(incidents.length).toBe(reports.length);
  for (const rep of reports) expect(incidents.find((e) => e.args!.req_id === rep.req_id)).toMatchObject({ ph: 'i', pid: rep.rank + 1, args: { detect_wave: rep.detect_wave } });

  // The coordinator: the startup config went to each replica once, at its first head.
  const configs = events.filter((e) => e.pid === 0 && e.cat === 'config');
  expect(configs.map((e) => e.args!.replica).sort()).toEqual([0, 1]);
  expect(configs.every((e) => e.args!.config_version === configs[0].args!.config_version)).toBe(true);
});

test('a tree without timelines still gives incidents; a missing dir is a usage error', () => {
  const bare = path.join(work, 'bare');
  fs.cpSync(tree.root, bare, { recursive: true });
  fs.rmSync(path.join(bare, path.relative(tree.root, tree.dumpRoot), 'timeline'), { recursive: true });
  const out = path.join(work, 'bare.json');
  const r = runWavebus(['trace', bare, '-o', out]);
  expect(r.code).toBe(0);
  expect(r.stderr).toMatch(/no rank timeline/);
  const events = JSON.parse(fs.readFileSync(out, 'utf8')).traceEvents as Ev[];
  checkFormat(events);
  expect(events.filter((e) => e.cat === 'incident').length).toBe(2);
  expect(events.filter((e) => e.cat === 'wave').length).toBe(0);
  expect(runWavebus(['trace', path.join(work, 'nope'), '-o', out]).code).toBe(2);
});

describe("the agent's timeline file (src/agent/timeline.ts)", () => {
  const id = { globalRank: 5, localRank: 1, worldSize: 8, tpRank: 1, ppRank: 0, dpRank: 1, cpRank: 0, host: 'h' } as unknown as RankIdentity;
  const modes = { file: 0o640, dir: 0o750 } as ArtifactModes;
  const log = { warn: jest.fn(), info: () => undefined } as unknown as Logger;

  test('dumps close together share one write, off the loop; the next comes after the gap; settled() ends it', async () => {
    const root = path.join(tmpDir('wavebus-timeline-'), 'dumps');
    const t = new WaveTimeline();
    const file = timelineFile(root, 5);
    t.writeSoon(root, id, modes, log); // nothing recorded yet: nothing to write
    await new Promise((r) => setTimeout(r, 50));
    expect(fs.existsSync(file)).toBe(false);
    t.record('dump', 1, 1.7e12, 2, 1);
    t.writeSoon(root, id, modes, log);
    t.record('dump', 2, 1.7e12 + 5, 2, 1);
    t.writeSoon(root, id, modes, log); // while the first is scheduled: folded into the next
    const first = Date.now();
    await waitFor(() => fs.existsSync(file), 'the first write', 5000);
    expect(fs.statSync(file).mode & 0o777).toBe(0o640);
    const second = JSON.parse(fs.readFileSync(file, 'utf8')).recorded;
    expect(second).toBeGreaterThanOrEqual(2); // the two dumps in one file
    t.record('dump', 3, 1.7e12 + 9, 2, 1);
    t.writeSoon(root, id, modes, log);
    await waitFor(() => JSON.parse(fs.readFileSync(file, 'utf8')).recorded === 3, 'the write after the gap', 10000);
    expect(Date.now() - first).toBeGreaterThanOrEqual(TIMELINE_WRITE_GAP_MS - 100);
    // Stopping: a scheduled write is dropped (the agent writes the last state itself), nothing runs after.
    t.record('dump', 4, 1.7e12 + 12, 2, 1);
    t.writeSoon(root, id, modes, log);
    await t.settled();
    await new Promise((r) => setTimeout(r, TIMELINE_WRITE_GAP_MS + 200));
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).recorded).toBe(3);
    expect(t.write(root, id, modes)).toBe(file);
    expect(JSON.parse(fs.readFileSync(file, 'utf8')).recorded).toBe(4);
    // No temp file left beside it, and no failure logged.
    expect(fs.readdirSync(path.dirname(file))).toEqual(['rank5.json']);
    expect(log.warn).not.toHaveBeenCalled();
  });
});
