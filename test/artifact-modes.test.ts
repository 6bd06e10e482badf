// Artifact modes: what another local user can read of a job's reports, KV dumps and snapshots.
// A real job (coordinator + guard, agent, client, shared memory) writes them; a real second uid
// tries to read them. Defaults: files 0640, dirs 0750 (umask respected); reports with token ids
// (save_sensitive_info) are created 0600 whatever --artifact-mode says.
import * as fs from 'fs';
import * as path from 'path';
import { DEFAULT_ARTIFACT_MODES, parseArtifactMode } from '../src/artifacts/artifact-mode';
import type { StepTelemetry } from '../src/messages';
import { cleanup, cleanupUsers, describeAsRoot, otherUser, runAs, runWavebus, waitFor } from './helpers';
import { runWave, startHarnessJob, step, stopHarnessJob, type HarnessJob } from './job-harness';

const SENSITIVE = {
  detector: { token_repeat: { enabled: true, on_trigger: ['report', 'dump_kv'] } },
  report: { save_sensitive_info: true },
  dump: { auto_max_times: 4, auto_cooldown_seconds: 0, free_headroom_bytes: 0 },
};

interface Written {
  report: string;
  dumpFile: string;
  snapshotFile: string;
}

/** Drive one request into a token_repeat hit (report + KV dump) and capture one input snapshot. */
async function writeArtifacts(job: HarnessJob): Promise<Written> {
  await waitFor(() => job.ranks[0].client.featureFlags() !== 0, 'bus active');
  const snap = await job.ranks[0].client.beforeForward(
    { compilationHash: 'graph-m', globalStep: 1, isPrompt: true, reqIds: ['r-1'], positions: [0, 1, 2], rowRequest: [0, 0, 0] },
    [{ region: 'input0', dtype: 'int32', shape: [3] }],
  );
  expect(snap.captured).toBe(true);
  let prev: StepTelemetry | undefined;
  const reportDir = path.join(job.reportRoot, 'token_repeat');
  let w = 1;
  for (; w <= 80 && !fs.existsSync(reportDir); w++) {
    await runWave(job, w, prev);
    prev = { wave: w, requests: [step('loop-9-abcd', [500 + (w % 2)], [3, 4], { numOutputTokens: w, promptTokenIds: [11, 12, 13] })], nonFinite: [] };
  }
  // Decided a wave ahead: the dump armed at the head that wrote the report is copied at the end of the next wave.
  await runWave(job, w, prev);
  await job.ranks[0].agent.drain();
  await waitFor(() => fs.existsSync(reportDir) && fs.readdirSync(reportDir).length > 0, 'the incident report');
  const report = path.join(reportDir, fs.readdirSync(reportDir)[0]);
  expect(JSON.parse(fs.readFileSync(report, 'utf8')).detail.output_token_ids.length).toBeGreaterThan(0);
  const reqDir = path.join(job.dumpRoot, 'token_repeat', 'loop-9-abcd');
  await waitFor(() => fs.existsSync(reqDir) && fs.readdirSync(reqDir).length > 0, 'the dump');
  const rankDir = path.join(reqDir, fs.readdirSync(reqDir)[0], 'dp0_tp0_pp0_cp0');
  await waitFor(() => fs.existsSync(path.join(rankDir, 'dump.json')), 'the rank bundle');
  return { report, dumpFile: path.join(rankDir, 'layers.0.pt'), snapshotFile: path.join(snap.callDir!, 'meta.json') };
}

/** Let the other user walk to the job's root (as on a shared scratch filesystem): only wavebus's own modes stand in the way. */
function openUpRoot(job: HarnessJob): void {
  fs.chmodSync(job.root, 0o755); // a mkdtemp dir under /tmp (1777)
}

const mode = (p: string) => fs.statSync(p).mode & 0o777;

describe('parseArtifactMode', () => {
  test('defaults to files 0640 and directories 0750', () => {
    expect(parseArtifactMode(undefined)).toEqual({ file: 0o640, dir: 0o750 });
    expect(DEFAULT_ARTIFACT_MODES).toEqual({ file: 0o640, dir: 0o750 });
    expect(parseArtifactMode('0600')).toEqual({ file: 0o600, dir: 0o700 });
    expect(parseArtifactMode('644')).toEqual({ file: 0o644, dir: 0o755 });
    expect(parseArtifactMode('0660')).toEqual({ file: 0o660, dir: 0o770 });
  });

  test.each([
    ['0666', /--artifact-mode: 0666 is world-writable/],
    ['0642', /--artifact-mode: 0642 is world-writable/],
    ['0440', /--artifact-mode: 0440 must let the owner read and write/],
    ['0750', /--artifact-mode: 0750 sets execute bits/],
    ['04640', /--artifact-mode: expected an octal file mode such as 0640/],
    ['rw-r-----', /--artifact-mode: expected an octal file mode/],
    ['0x1a0', /--artifact-mode: expected an octal file mode/],
    ['0648', /--artifact-mode: expected an octal file mode/],
  ])('refuses %j naming the flag', (raw, err) => {
    expect(() => parseArtifactMode(raw)).toThrow(err);
  });

  test('the agent, the coordinator and launch refuse a bad mode naming the flag before starting anything', () => {
    for (const cmd of [['coordinator'], ['agent'], ['launch', '--nproc-per-node', '1']]) {
      const r = runWavebus([...cmd, '--artifact-mode', '0777', ...(cmd[0] === 'launch' ? ['--', 'true'] : [])], { timeout: 30000 });
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/--artifact-mode: 0777 is world-writable/);
    }
  });
});

describeAsRoot('another local user', () => {
  let job: HarnessJob | undefined;
  let umask: number;
  beforeAll(() => {
    umask = process.umask(0o022); // the common umask: what the modes alone allow
  });
  afterEach(async () => {
    if (job) await stopHarnessJob(job);
    job = undefined;
  });
  afterAll(async () => {
    process.umask(umask);
    await cleanup();
    cleanupUsers();
  });

  test('cannot read a sensitive report, a KV dump file or a snapshot file written with the default modes', async () => {
    const other = otherUser('amode');
    job = await startHarnessJob({ tp: 1, runtimeConfig: SENSITIVE, snapshotEnv: { WAVEBUS_SNAPSHOT_ENABLE: '1' } });
    const w = await writeArtifacts(job);
    openUpRoot(job);
    expect(mode(w.report)).toBe(0o600);
    expect(mode(w.dumpFile)).toBe(0o640);
    expect(mode(path.dirname(w.dumpFile))).toBe(0o750);
    expect(mode(w.snapshotFile)).toBe(0o640);
    expect(mode(path.dirname(w.snapshotFile))).toBe(0o750);
    for (const f of [w.report, w.dumpFile, w.snapshotFile]) {
      const r = runAs(other, 'cat', [f]);
      expect({ f, code: r.code }).toEqual({ f, code: 1 });
      expect(r.stderr).toMatch(/Permission denied/);
    }
  });

  test('with --artifact-mode 0644 dumps and snapshots are readable by them, a report with token ids still is not', async () => {
    const other = otherUser('amode');
    job = await startHarnessJob({ tp: 1, runtimeConfig: SENSITIVE, snapshotEnv: { WAVEBUS_SNAPSHOT_ENABLE: '1' }, artifactModes: parseArtifactMode('0644') });
    const w = await writeArtifacts(job);
    openUpRoot(job);
    expect(mode(w.dumpFile)).toBe(0o644);
    expect(runAs(other, 'cat', [w.snapshotFile]).code).toBe(0); // the attempt below can succeed: it is the mode that stops it
    expect(runAs(other, 'head', ['-c', '4', w.dumpFile]).code).toBe(0);
    expect(mode(w.report)).toBe(0o600);
    const r = runAs(other, 'cat', [w.report]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/Permission denied/);
  });
});
