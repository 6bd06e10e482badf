// Fingerprints (docs/fingerprints.md): each rank's versions, device, allow-listed environment and
// weight checksums reach the coordinator, and every incident report carries `fingerprint_diff`.
// The end-to-end case is a real DP=2 torch job under `wavebus launch`: one rank with one flipped
// weight byte, one rank with a different NCCL_ALGO; the incident's diff names both, nothing else.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { FingerprintBook } from '../src/guard/fingerprint-diff';
import { sanitizeFingerprint } from '../src/guard/fingerprint';
import { clientFingerprint, fingerprintEnv } from '../src/client/fingerprint';
import { FingerprintKeeper, WEIGHTS_SETTLE_MS } from '../src/agent/fingerprint-keeper';
import { RegionKind } from '../src/client/protocol';
import { ShmSegment } from '../src/memory';
import { ROOT, cleanup, freePortPair, spawnWavebus, tmpDir, waitFor } from './helpers';
import { torchRanks } from './torch2';
import { startHarnessJob, stopHarnessJob } from './job-harness';

afterAll(cleanup);

// How the engine's ranks start: torch 2.x's torchrun (the stand-in where torch 2.x is absent); its python for what reads their files.
const RANKS = torchRanks();

const BASE = { wavebusVersion: '0.1.0', language: 'python', runtimeVersion: 'python 3.11', torchVersion: '2.1', deviceName: 'cpu' };

describe('what a rank may send', () => {
  test('the clients keep only the allow-listed variables, and never the value of a secret-looking one', () => {
    const env = { NCCL_ALGO: 'Ring', NCCL_IB_HCA: 'mlx5', HF_TOKEN: 'hf_x', VLLM_API_KEY: 'sk-1', TORCH_PASSWORD_X: 'p', PATH: '/bin', CUDA_VISIBLE_DEVICES: '0' };
    expect(fingerprintEnv(env)).toEqual([
      { name: 'CUDA_VISIBLE_DEVICES', value: '0', redacted: false },
      { name: 'NCCL_ALGO', value: 'Ring', redacted: false },
      { name: 'NCCL_IB_HCA', value: 'mlx5', redacted: false },
      { name: 'TORCH_PASSWORD_X', value: '', redacted: true },
      { name: 'VLLM_API_KEY', value: '', redacted: true },
    ]);
    const fp = clientFingerprint({ engineVersion: 'eng 2', env });
    expect(fp).toMatchObject({ language: 'typescript', engineVersion: 'eng 2', deviceName: 'cpu' });
    expect(JSON.stringify(fp)).not.toContain('sk-1');
  });

  test('the coordinator trusts nothing: garbage is cut to limits, names outside the list dropped, secrets redacted again', () => {
    const fp = sanitizeFingerprint({
      torchVersion: 'x'.repeat(5000),
      language: 7,
      env: [{ name: 'PATH', value: '/bin' }, { name: 'NCCL_SOCKET_TOKEN', value: 'leak', redacted: false }, { name: 'NCCL_../x', value: 'a' }, null, 'junk'],
      weights: [{ name: 'w', checksum: 'crc32c:0123abcd', bytes: -4 }, { name: 'bad', checksum: 'md5:00' }, { checksum: 'crc32c:00000000' }],
    });
    expect(fp.torchVersion).toHaveLength(256);
    expect(fp.language).toBe('');
    expect(fp.env).toEqual([{ name: 'NCCL_SOCKET_TOKEN', value: '', redacted: true }]);
    expect(fp.weights).toEqual([{ name: 'w', checksum: 'crc32c:0123abcd', bytes: 0, dtype: '' }]);
    expect(sanitizeFingerprint(undefined).env).toEqual([]);
    expect(sanitizeFingerprint('garbage').weights).toEqual([]);
  });
});

describe('fingerprint_diff', () => {
  const layout = { worldSize: 4, tp: 2, pp: 1, dp: 2, cp: 1 };
  const w = (sum: string) => [{ name: 'lm_head', checksum: sum, bytes: 4, dtype: 'float32' }];

  test('versions and env are compared across all ranks, weights only across DP replicas of one shard', () => {
    const book = new FingerprintBook(layout);
    // TP shards differ by design (rank 0 vs 1): not a difference. Rank 3 (dp1 tp1) differs from rank 1.
    book.set(0, { ...BASE, env: [{ name: 'NCCL_ALGO', value: 'Ring' }], weights: w('crc32c:00000001') });
    book.set(1, { ...BASE, env: [{ name: 'NCCL_ALGO', value: 'Ring' }], weights: w('crc32c:00000002') });
    book.set(2, { ...BASE, env: [{ name: 'NCCL_ALGO', value: 'Ring' }], weights: w('crc32c:00000001') });
    book.set(3, { ...BASE, torchVersion: '2.2', env: [{ name: 'NCCL_ALGO', value: 'Ring' }, { name: 'NCCL_SECRET', redacted: true }], weights: w('crc32c:00000003') });
    expect(book.set(9, BASE)).toBe(false); // outside the layout
    expect(book.diff()).toEqual({
      ranks: [0, 1, 2, 3],
      differences: [
        { kind: 'version', name: 'torch_version', among: 'all', values: [{ value: '2.1', ranks: [0, 1, 2] }, { value: '2.2', ranks: [3] }] },
        { kind: 'env', name: 'NCCL_SECRET', among: 'all', values: [{ value: null, ranks: [0, 1, 2] }, { value: '<redacted>', ranks: [3] }] },
        { kind: 'weight', name: 'lm_head', among: 'pp0_tp1_cp0', values: [{ value: 'crc32c:00000002', ranks: [1] }, { value: 'crc32c:00000003', ranks: [3] }] },
      ],
    });
    expect(book.status()).toEqual({ ranks: [0, 1, 2, 3], differences: ['version:torch_version', 'env:NCCL_SECRET', 'weight:lm_head@pp0_tp1_cp0'] });
  });

  test('ranks that agree: no differences; a rank that registered no weights is not compared on them', () => {
    const book = new FingerprintBook(layout);
    book.set(0, { ...BASE, weights: w('crc32c:00000001') });
    book.set(2, { ...BASE });
    expect(book.diff()).toEqual({ ranks: [0, 2], differences: [] });
    // A fingerprint that comes in later counts in the next diff (the cached one is dropped).
    book.set(2, { ...BASE, weights: w('crc32c:0000000f') });
    expect(book.diff().differences.map((d) => `${d.kind}:${d.name}@${d.among}`)).toEqual(['weight:lm_head@pp0_tp0_cp0']);
  });
});

test('weight shards registered one at a time: the checksums go to the coordinator once per register_weights call (before its last answer), not once per shard', async () => {
  const seg = ShmSegment.create(`/wavebus-fp-settle-${process.pid}`, 64 * 4);
  const sent: Record<string, any>[] = [];
  const keeper = new FingerprintKeeper((fp) => sent.push(fp));
  try {
    seg.buffer().fill(7);
    keeper.hello(BASE);
    expect(sent).toHaveLength(1);
    const shard = (i: number, lastWeight: boolean) => ({ name: `layer${i}.w`, kind: RegionKind.SHM, shmName: seg.name, offset: i * 4, nbytes: 4, cudaIpcHandle: Buffer.alloc(0), device: 0, dtype: 'float32', shape: [1], role: 2, layer: '', kv: '', lastWeight });
    // As register_weights does: each shard's answer awaited before the next is sent; the last says so.
    for (let i = 0; i < 64; i++) {
      await keeper.addWeight(shard(i, i === 63));
      // Sent before the last shard's answer, never before.
      expect(sent).toHaveLength(i === 63 ? 2 : 1);
    }
    expect(sent[1].weights).toHaveLength(64);
    expect(new Set(sent[1].weights.map((w: any) => w.checksum)).size).toBe(1); // the same four bytes each
    // A call cut short (no shard said it was the last): sent once, WEIGHTS_SETTLE_MS later.
    await keeper.addWeight(shard(0, false));
    expect(sent).toHaveLength(2);
    await waitFor(() => sent.length === 3, 'the settled fingerprint', 5000, 10);
    await new Promise((r) => setTimeout(r, WEIGHTS_SETTLE_MS + 200));
    expect(sent).toHaveLength(3);
  } finally {
    keeper.close();
    seg.close();
    ShmSegment.unlink(seg.name);
  }
});

test('TypeScript clients: the hello carries the fingerprint to the coordinator, shown in its status (/healthz)', async () => {
  const job = await startHarnessJob({ tp: 1, dp: 2, runtimeConfig: { detector: { token_repeat: { enabled: true } } } });
  try {
    // Wavebus is on (a detector): each client says hello by its first step once its agent has the config.
    for (const r of job.ranks) await waitFor(() => r.client.featureFlags() !== 0, 'the agent has the config');
    for (const r of job.ranks) {
      await r.client.waveHead(1);
      await r.client.endOfWave(1);
    }
    await waitFor(() => job.coordinator.fingerprints.size === 2, 'both fingerprints at the coordinator');
    const fp = job.coordinator.fingerprints.get(1)!;
    expect(fp).toMatchObject({ language: 'typescript', runtimeVersion: `node ${process.versions.node}`, deviceName: 'cpu', weights: [] });
    expect(fp.wavebusVersion).toBe(JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')).version);
    expect(job.guard.fingerprints).toBe(job.coordinator.fingerprints); // one book: the guard's reports diff what the coordinator stored
    expect(job.coordinator.status().fingerprints).toEqual({ ranks: [0, 1], differences: [] });
  } finally {
    await stopHarnessJob(job);
  }
});

test('a DP=2 torch job, one flipped weight byte on rank 1 and NCCL_ALGO=Tree on rank 0: the incident diff names both and nothing else; token ids hashed with the key file given', async () => {
  const dir = tmpDir('wavebus-fp-');
  const out = path.join(dir, 'out');
  const engine = path.join(ROOT, 'examples', 'torch-engine');
  const runtimeConfig = {
    detector: { logits_finite: { enabled: true }, token_repeat: { enabled: false }, garbled: { enabled: false }, spec_acceptance: { enabled: false } },
    actions: { defaults: { on_trigger: ['report'] } },
    report: { save_sensitive_info: 'hashed' },
  };
  // The key the coordinator hashes token ids with: a file of ours, 0600, named by the environment.
  const keyFile = path.join(dir, 'hash.key');
  const key = crypto.randomBytes(32);
  fs.writeFileSync(keyFile, key.toString('hex') + '\n', { mode: 0o600 });
  const hash = (id: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(id, 0);
    return crypto.createHmac('sha256', key).update('wavebus token id v1\0').update(b).digest('hex').slice(0, 16);
  };
  const port = await freePortPair();
  const launch = spawnWavebus(
    [
      'launch', '--nproc-per-node', '2', '--tp', '1', '--dp', '2', '--port', String(port),
      '--additional-config', JSON.stringify({ runtime_config: runtimeConfig }),
      '--agent-arg=--end-of-wave-timeout-ms', '--agent-arg=2000',
      '--', ...RANKS.command(path.join(engine, 'engine.py'), { nproc: 2 }), '--out', out,
      '--dp', '2', '--requests', '2', '--max-tokens', '8', '--fault', 'nan:6:0',
      '--flip-byte', '1:layers.0.q:0', '--env-on-rank', '0:NCCL_ALGO=Tree',
    ],
    { env: { ...process.env, NCCL_ALGO: 'Ring', NCCL_TEST_TOKEN: 'never-in-a-report', WAVEBUS_TOKEN_HASH_KEY_FILE: keyFile, WAVEBUS_CACHE_ROOT: path.join(dir, 'cache') }, cwd: dir },
  );
  const { code } = await launch.exited;
  if (code !== 0) throw new Error(`launch exited ${code}\n${launch.stdout().slice(-4000)}\n${launch.stderr().slice(-6000)}`);
  const reportDir = path.join(dir, 'runtime', 'report', 'logits_finite');
  const outputs = JSON.parse(fs.readFileSync(path.join(out, 'outputs.json'), 'utf8'));
  const reports = fs.readdirSync(reportDir).map((f) => JSON.parse(fs.readFileSync(path.join(reportDir, f), 'utf8')));
  expect(reports.length).toBeGreaterThan(0);
  for (const r of reports) {
    expect(r.fingerprint_diff.ranks).toEqual([0, 1]);
    expect(r.fingerprint_diff.differences).toEqual([
      { kind: 'env', name: 'NCCL_ALGO', among: 'all', values: [{ value: 'Tree', ranks: [0] }, { value: 'Ring', ranks: [1] }] },
      { kind: 'weight', name: 'layers.0.q', among: 'pp0_tp0_cp0', values: [{ value: expect.stringMatching(/^crc32c:[0-9a-f]{8}$/), ranks: [0] }, { value: expect.stringMatching(/^crc32c:[0-9a-f]{8}$/), ranks: [1] }] },
    ]);
    expect(JSON.stringify(r)).not.toContain('never-in-a-report');
    // Hashed, not in clear: the prompt's ids (its bytes) under the key, and how they were made.
    const prompt = [...Buffer.from(outputs.requests[r.req_id].prompt, 'latin1')];
    expect(r.detail.prompt_token_ids).toEqual(prompt.map(hash));
    expect(r.detail.token_id_hash).toMatchObject({ alg: 'hmac-sha256/64', key_source: 'file', key_id: expect.stringMatching(/^[0-9a-f]{16}$/) });
    expect(JSON.stringify(r)).not.toContain(key.toString('hex'));
  }
  expect((fs.statSync(path.join(reportDir, fs.readdirSync(reportDir)[0])).mode & 0o777).toString(8)).toBe('600');
}, 240000);
