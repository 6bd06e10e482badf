// Fuzzing the parser and file surfaces (test/fuzz-surfaces.ts SURFACES; docs/fuzzing.md): the
// control requests as the coordinator's ROUTER path takes them, the status document `wavebus
// status` draws, the probe trees `wavebus bisect` reads, the trees `wavebus report` reads. Each
// surface gets FUZZ_INPUTS[name] inputs here (100 000 for the in-process parsers; the file
// surfaces read a whole tree per input, so fewer here and 100 000 with WAVEBUS_FUZZ_FULL=1, the run
// docs/fuzzing.md reports). Every input is accepted or refused for a named reason; the counts by
// reason are checked to show the garbage reached past the first check.
import * as fs from 'fs';
import * as path from 'path';
import { fuzzSurface, SURFACES, type SurfaceResult } from './fuzz-surfaces';
import { cleanup, tmpDir } from './helpers';

const FULL = process.env.WAVEBUS_FUZZ_FULL === '1';
// A full run's file surfaces read a whole tree 100 000 times: tens of minutes each on a loaded host.
jest.setTimeout(FULL || process.env.WAVEBUS_FUZZ_INPUTS ? 6 * 3600000 : 1200000);
afterAll(cleanup);

/** WAVEBUS_FUZZ_INPUTS=N: N inputs for every surface (a quick look, or a longer run). */
const EVERY = Number(process.env.WAVEBUS_FUZZ_INPUTS) || undefined;
/** Inputs per surface in this run. */
const FUZZ_INPUTS: Record<string, number> = {
  control_request: EVERY ?? 100000,
  status_reply: EVERY ?? 100000,
  probe_bundle: EVERY ?? (FULL ? 100000 : 300),
  report_tree: EVERY ?? (FULL ? 100000 : 300),
  recorder_ring: EVERY ?? 100000,
  // Each input writes, maps and unmaps a 4 KiB+ file through the addon: cheap, so all of them.
  mailbox_attach: EVERY ?? 100000,
  engine_crash: EVERY ?? 100000,
  fingerprint: EVERY ?? 100000,
  // A small tree (two ranks' crash files, four call bundles) read whole per input: a few ms each.
  recorder_flush: EVERY ?? (FULL ? 100000 : 5000),
  // One part of a slot rewritten, the slot read back with a few preads: cheap.
  telemetry_ring: EVERY ?? 100000,
  // An accepted request stages its files and starts a process (the stand-in replay): a few ms each.
  replay_request: EVERY ?? (FULL ? 100000 : 1000),
  // A slot part rewritten, the ring polled and each wave's two columns asked: a few preads each.
  decision_ring: EVERY ?? (FULL ? 100000 : 5000),
  // A frame through the ROUTER path into a fresh comparison, the column asks settled: in process.
  rank_digests: EVERY ?? (FULL ? 100000 : 5000),
};

const results: Record<string, SurfaceResult> = {};

afterAll(() => {
  // The figures docs/fuzzing.md quotes (printed, so a run's numbers can be copied with its commit).
  if (process.env.WAVEBUS_FUZZ_PRINT === '1') process.stdout.write(`${JSON.stringify(results, null, 1)}\n`);
});

test('every surface has an input count here', () => {
  expect(Object.keys(FUZZ_INPUTS).sort()).toEqual(SURFACES.map((s) => s.name).sort());
});

describe.each(SURFACES.map((s) => [s.name, s] as const))('%s', (name, surface) => {
  test(`garbage and mutations: every input accepted or refused with a named reason, still working afterwards`, async () => {
    const dir = tmpDir(`wavebus-fuzz-${name}-`);
    fs.mkdirSync(path.join(dir, 'tree'));
    const r = await fuzzSurface(surface, path.join(dir, 'tree'), FUZZ_INPUTS[name], 20261202);
    results[name] = r;
    expect(r.problems).toEqual([]);
    expect(r.unaccounted).toBe(0);
    expect(r.alive).toBe(true);
    const accepted = Object.values(r.accepted).reduce((a, b) => a + b, 0);
    const refused = Object.values(r.refused).reduce((a, b) => a + b, 0);
    expect(accepted + refused).toBe(r.inputs);
    // Both happened, and the refusals came from more than the first check.
    expect(accepted).toBeGreaterThan(0);
    expect(Object.keys(r.refused).length).toBeGreaterThanOrEqual(name === 'status_reply' ? 1 : 3);
    for (const reason of Object.keys(r.refused)) expect(reason).toMatch(/^(drop|refused|control|status|report|torn|flush|mailbox|ring):\w+|^\w+Error:ERR_[A-Z_]+$/);
  });
});

test('control requests: refusals by the coordinator name their error code, and each kind is answered', async () => {
  const r = results.control_request ?? (await fuzzSurface(SURFACES[0], tmpDir('wavebus-fuzz-ctl-'), 20000, 5));
  for (const k of ['control:status', 'control:dump', 'control:capture', 'control:query', 'control:verdict']) expect(r.accepted[k]).toBeGreaterThan(0);
  // Refused by code and by the field the reason names first (capture.format, dump.request_id, ...).
  const named = Object.keys(r.refused).filter((k) => k.startsWith('control:'));
  expect(named.length).toBeGreaterThanOrEqual(4);
  for (const k of named) expect(k).toMatch(/^control:ERR_[A-Z_]+:(control|dump|capture|query|verdict)\b/);
  expect(Object.keys(r.refused).filter((k) => k.startsWith('drop:')).length).toBeGreaterThanOrEqual(3);
});

test('host files: a mailbox of another version, a link or a second name is refused by name; a ring slot past its bounds is left out by name', async () => {
  const mb = results.mailbox_attach ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'mailbox_attach')!, tmpDir('wavebus-fuzz-mb-'), 3000, 5));
  // The version check is the fix this fuzz found: attach wrote into a mailbox of any version with the magic.
  for (const k of ['mailbox:ERR_MAILBOX_FORMAT:version', 'mailbox:ERR_MAILBOX_FORMAT:shorter', 'mailbox:ERR_MAILBOX_OPEN:symbolic_link', 'mailbox:ERR_MAILBOX_OPEN:links']) expect(mb.refused[k]).toBeGreaterThan(0);
  const ring = results.recorder_ring ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'recorder_ring')!, tmpDir('wavebus-fuzz-ring-'), 3000, 5));
  for (const k of ['torn:lengths_past_the_slot', 'torn:input_sizes']) expect(ring.refused[k]).toBeGreaterThan(0);
  expect(ring.accepted['ring:4_forwards']).toBeGreaterThan(0);
});

test('telemetry ring: whole heads relayed with columns the coordinator accepts; torn slots, counts past the ring, bad rows, events, tokens and extras dropped by name', async () => {
  const r = results.telemetry_ring ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'telemetry_ring')!, tmpDir('wavebus-fuzz-ring-'), 5000, 5));
  expect(r.accepted.head_4rows_3tokens).toBeGreaterThan(0);
  const refused = Object.keys(r.refused).join(' ');
  for (const kind of ['torn', 'bad_counts', 'bad_extra']) expect([kind, refused.includes(kind)]).toEqual([kind, true]);
  const dropped = Object.keys(r.accepted).filter((k) => k.startsWith('head_dropped_')).join(' ');
  for (const kind of ['token_out_of_range', 'row_out_of_range', 'bad_event']) expect([kind, dropped.includes(kind)]).toEqual([kind, true]);
});

test('replay requests: the agent refuses each bad field by name, replays the rest, and leaves nothing staged', async () => {
  const r = results.replay_request ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'replay_request')!, tmpDir('wavebus-fuzz-replay-'), 1500, 5));
  expect(r.accepted.replayed).toBeGreaterThan(0);
  // The refusals reach past the first check: paths, the lists' bounds, tolerances, the timeout.
  for (const field of ['refused:files', 'refused:calls', 'refused:incident', 'refused:tolerances', 'refused:timeout_ms']) expect([field, r.refused[field] > 0]).toEqual([field, true]);
  expect(Object.keys(r.refused).some((k) => k.startsWith('drop:'))).toBe(true);
});

test('decision ring: every wave the agent sends is whole; a column it cannot give names why (counts past the ring, row starts outside the forward, a slot gone)', async () => {
  const r = results.decision_ring ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'decision_ring')!, tmpDir('wavebus-fuzz-dr-'), 3000, 5));
  expect(r.accepted.waves_4).toBeGreaterThan(0);
  // Fewer waves sent: a slot torn (odd seq), its wave moved to another slot, or undecided.
  expect(Object.keys(r.accepted).filter((k) => k !== 'waves_4').length).toBeGreaterThan(0);
  const refused = Object.keys(r.refused).join(' ');
  for (const kind of ['digest_only', 'inputs_do_not_fit', 'row_starts_outside']) expect([kind, refused.includes(kind)]).toEqual([kind, true]);
});

test('rank digests: hostile digests and column answers are compared or dropped by name, never an unresolved divergence', async () => {
  const r = results.rank_digests ?? (await fuzzSurface(SURFACES.find((s) => s.name === 'rank_digests')!, tmpDir('wavebus-fuzz-rd-'), 3000, 5));
  const accepted = Object.keys(r.accepted).join(' ');
  for (const kind of ['agreed', 'diverged']) expect([kind, accepted.includes(kind)]).toEqual([kind, true]);
  for (const k of ['drop:truncated', 'drop:rank_out_of_range']) expect(r.refused[k]).toBeGreaterThan(0);
  // A tenth of the inputs or more reach the comparison (a version refusal of one connection does not stop the rest).
  const compared = Object.entries(r.accepted).filter(([k]) => k.startsWith('compared:')).reduce((a, [, n]) => a + n, 0);
  expect(compared).toBeGreaterThan(r.inputs / 10);
});
