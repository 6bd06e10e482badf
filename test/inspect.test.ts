// `wavebus inspect`: real bundles written with Bundle, then deliberate damage; every problem is
// named and turns the exit code non-zero.
import * as fs from 'fs';
import * as path from 'path';
import { Bundle } from '../src/artifacts/bundle';
import { inspectTree, type InspectResult } from '../src/tools/inspect';
import { Tensor } from '../src/artifacts/tensor';
import { cleanup, runWavebus, tmpDir } from './helpers';

afterAll(cleanup);

const WAVE = 'kv_cache/token_repeat/req-9/wave_4';
/** The seed's rank dirs of a tp=2 dp=2 job (TP fastest), by global rank. */
const SEED_DIRS = ['dp0_tp0_pp0_cp0', 'dp0_tp1_pp0_cp0', 'dp1_tp0_pp0_cp0', 'dp1_tp1_pp0_cp0'];
const LAYOUT = { world_size: 4, tp: 2, pp: 1, dp: 2, cp: 1 };

/**
 * A dump wave (4 ranks of tp=2 dp=2, npy k/v in bf16, request_info + manifest as the coordinator
 * writes them) and a snapshot call. `legacy`: the rank<g>/ dirs of wavebus before the seed's names
 * (no layout recorded).
 */
async function writeTree(root: string, legacy = false): Promise<void> {
  const wave = path.join(root, WAVE);
  const manifestFiles: Record<string, unknown[]> = {};
  const dirOf = (g: number) => (legacy ? `rank${g}` : SEED_DIRS[g]);
  for (let g = 0; g < 4; g++) {
    const b = Bundle.begin(path.join(wave, dirOf(g)));
    const files = [];
    for (const kv of ['k', 'v']) {
      const data = Buffer.alloc(2 * 4 * 2 * 8 * 2, g * 16 + (kv === 'k' ? 1 : 2));
      files.push(await b.writeTensor(`model.layers.0.self_attn.${kv}.npy`, 'npy', Tensor.fromBuffer('bfloat16', [2, 4, 2, 8], data)));
    }
    const all = await b.commit({
      name: 'dump.json',
      value: { schema: 1, req_id: 'req-9', incident_type: 'token_repeat', arm_wave: 4, format: 'npy', identity: { global_rank: g, tp_rank: g % 2, dp_rank: g >> 1, pp_rank: 0, cp_rank: 0, tp_size: 2 }, layers: [{ layer: 'model.layers.0.self_attn', dtype: 'bfloat16', shape: [2, 4, 2, 8] }], files },
    });
    manifestFiles[String(g)] = all.map((f) => ({ ...f, path: `${dirOf(g)}/${f.path}` }));
  }
  const layout = legacy ? {} : { layout: LAYOUT };
  const dirs = legacy ? {} : { dirs: Object.fromEntries(SEED_DIRS.map((d, g) => [g, d])) };
  fs.writeFileSync(path.join(wave, 'request_info.json'), JSON.stringify({ req_id: 'req-9', incident_type: 'token_repeat', arm_wave: 4, expected_ranks: [0, 1, 2, 3], ...layout }));
  fs.writeFileSync(path.join(wave, 'manifest.json'), JSON.stringify({ expected_ranks: [0, 1, 2, 3], ...layout, ...dirs, completed_ranks: [0, 1, 2, 3], missing_ranks: [], files: manifestFiles, complete: true }));
  const s = Bundle.begin(path.join(root, 'snapshots', 'hashZ', 'rank1', 'call2'));
  const t0 = await s.writeTensor('tensor0.pt', 'pt', Tensor.fromBuffer('int64', [3], new BigInt64Array([1n, 2n, 3n])));
  const t1 = await s.writeTensor('tensor1.npy', 'npy', Tensor.fromBuffer('float8_e4m3fn', [4], Buffer.from([0x38, 0x40, 0x48, 0x7e])));
  await s.commit({
    name: 'meta.json',
    value: { schema: 1, hash: 'hashZ', global_rank: 1, tp_rank: 1, call_index: 2, format: 'pt', inputs: [{ index: 0, dtype: 'int64', shape: [3] }, { index: 1, dtype: 'float8_e4m3fn', shape: [4] }], files: [t0, t1].map((f) => ({ name: f.path, bytes: f.bytes, checksum: f.checksum })) },
  });
}

async function fresh(legacy = false): Promise<string> {
  const root = tmpDir('wavebus-inspect-');
  await writeTree(root, legacy);
  return root;
}

function cli(root: string, ...flags: string[]) {
  const r = runWavebus(['inspect', root, ...flags]);
  return { ...r, json: flags.includes('--json') ? (JSON.parse(r.stdout) as InspectResult) : undefined };
}

describe('inspect', () => {
  test('a healthy tree: bundles with kind, ranks, dtypes (bf16 / fp8 from the bundle JSON), shapes, bytes; exit 0', async () => {
    const root = await fresh();
    // An interrupted writer's temp dir is reported as incomplete, not as a problem.
    fs.mkdirSync(path.join(root, 'kv_cache', '.wave_5.tmp-123-abcdef01@host'), { recursive: true });
    const r = cli(root, '--verify', '--json');
    expect(r.code).toBe(0);
    const res = r.json!;
    expect(res.problems).toEqual([]);
    expect(res.incomplete).toHaveLength(1);
    const kinds = res.bundles.map((b) => `${b.kind}:${b.dir}`);
    expect(kinds).toContain(`dump_wave:${WAVE}`);
    expect(kinds).toContain(`kv_dump:${WAVE}/dp1_tp1_pp0_cp0`);
    expect(kinds).toContain('snapshot:snapshots/hashZ/rank1/call2');
    const wave = res.bundles.find((b) => b.kind === 'dump_wave')!;
    expect(wave.ranks).toEqual([0, 1, 2, 3]);
    expect(wave.info.rank_dirs).toEqual({ 0: SEED_DIRS[0], 1: SEED_DIRS[1], 2: SEED_DIRS[2], 3: SEED_DIRS[3] });
    const rank2 = res.bundles.find((b) => b.dir === `${WAVE}/dp1_tp0_pp0_cp0`)!;
    expect(rank2.dtypes).toEqual(['bfloat16']);
    expect(rank2.tensors.map((t) => t.shape)).toEqual([[2, 4, 2, 8], [2, 4, 2, 8]]);
    expect(rank2.files.every((f) => f.verified)).toBe(true);
    expect(rank2.bytes).toBe(rank2.files.reduce((n, f) => n + f.bytes, 0));
    const snap = res.bundles.find((b) => b.kind === 'snapshot')!;
    expect(snap.dtypes.sort()).toEqual(['float8_e4m3fn', 'int64']);
    expect(snap.ranks).toEqual([1]);
    const text = cli(root, '--verify');
    expect(text.stdout).toMatch(/kv_dump\s+\S+\/dp0_tp0_pp0_cp0\s+ranks=0\s+files=2\s+bytes=\d+\s+dtypes=bfloat16\s+shapes=\[2,4,2,8\]/);
    expect(text.stdout).toMatch(/6 bundle\(s\), 0 problem\(s\)/);
  });

  test('damage is named and exits 1: missing rank, missing file, flipped byte (verify), truncation, unlisted file', async () => {
    const missingRank = await fresh();
    fs.rmSync(path.join(missingRank, WAVE, 'dp1_tp0_pp0_cp0'), { recursive: true });
    let r = cli(missingRank);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${WAVE}: rank 2 missing: no dp1_tp0_pp0_cp0/dump.json`);

    const missingFile = await fresh();
    fs.rmSync(path.join(missingFile, WAVE, 'dp0_tp1_pp0_cp0', 'model.layers.0.self_attn.v.npy'));
    r = cli(missingFile, '--json');
    expect(r.code).toBe(1);
    // Named once although both dump.json and the wave manifest list it.
    expect(r.json!.problems).toEqual([`${WAVE}/dp0_tp1_pp0_cp0/model.layers.0.self_attn.v.npy: missing`]);

    const flipped = await fresh();
    const f = path.join(flipped, WAVE, 'dp1_tp1_pp0_cp0', 'model.layers.0.self_attn.k.npy');
    const b = fs.readFileSync(f);
    b[b.length - 3] ^= 1;
    fs.writeFileSync(f, b);
    const plain = cli(flipped);
    expect(plain.stderr).toBe("");
    expect(plain.code).toBe(0); // same size: only --verify can see it
    r = cli(flipped, '--verify');
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(new RegExp(`${WAVE}/dp1_tp1_pp0_cp0/model.layers.0.self_attn.k.npy: checksum crc32c:[0-9a-f]{8} != recorded crc32c:[0-9a-f]{8}`));

    const truncated = await fresh();
    const meta = path.join(truncated, WAVE, 'dp0_tp0_pp0_cp0', 'dump.json');
    fs.truncateSync(meta, 10); // the wave manifest records dump.json itself
    r = cli(truncated, '--json');
    expect(r.code).toBe(1);
    expect(r.json!.problems.join('\n')).toMatch(/dp0_tp0_pp0_cp0\/dump\.json: unreadable JSON/);
    expect(r.json!.problems.join('\n')).toMatch(new RegExp(`${WAVE}/dp0_tp0_pp0_cp0/dump.json: 10 bytes, recorded \\d+`));

    const extra = await fresh();
    fs.writeFileSync(path.join(extra, 'snapshots', 'hashZ', 'rank1', 'call2', 'tensor7.pt'), 'stray');
    r = cli(extra);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('snapshots/hashZ/rank1/call2/tensor7.pt: not listed in meta.json');

    const wrongSize = await fresh();
    fs.appendFileSync(path.join(wrongSize, 'snapshots', 'hashZ', 'rank1', 'call2', 'tensor1.npy'), 'xx');
    r = cli(wrongSize);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/call2\/tensor1\.npy: \d+ bytes, recorded \d+/);
  });

  test('a wave dir of wavebus before the seed names (rank<g>/, no layout) still inspects clean; a missing rank is named', async () => {
    const old = await fresh(true);
    const r = cli(old, '--verify', '--json');
    expect(r.json!.problems).toEqual([]);
    expect(r.code).toBe(0);
    const wave = r.json!.bundles.find((b) => b.kind === 'dump_wave')!;
    expect(wave.ranks).toEqual([0, 1, 2, 3]);
    expect(wave.info.rank_dirs).toEqual({ 0: 'rank0', 1: 'rank1', 2: 'rank2', 3: 'rank3' });
    expect(r.json!.bundles.filter((b) => b.kind === 'kv_dump').map((b) => b.dir)).toEqual([0, 1, 2, 3].map((g) => `${WAVE}/rank${g}`));
    fs.rmSync(path.join(old, WAVE, 'rank3'), { recursive: true });
    expect(inspectTree(old).problems).toEqual([`${WAVE}: rank 3 missing`, ...['model.layers.0.self_attn.k.npy', 'model.layers.0.self_attn.v.npy', 'dump.json'].map((f) => `${WAVE}/rank3/${f}: missing`)]);
  });

  test('a rank dir whose name is not the seed form, or disagrees with its dump.json or the recorded layout, is a problem', async () => {
    // A name of neither layout (leading zero): refused by the parser, and the rank it should hold is missing.
    const badName = await fresh();
    fs.renameSync(path.join(badName, WAVE, 'dp0_tp1_pp0_cp0'), path.join(badName, WAVE, 'dp0_tp01_pp0_cp0'));
    let p = inspectTree(badName).problems;
    expect(p).toContain(`${WAVE}/dp0_tp01_pp0_cp0: KV dump directory "dp0_tp01_pp0_cp0" is not dp<d>_tp<t>_pp<p>_cp<c> (decimal, no leading zeros) (nor rank<g> of an older wavebus)`);
    expect(p).toContain(`${WAVE}: rank 1 missing: no dp0_tp1_pp0_cp0/dump.json`);
    // Two ranks' dirs swapped: each name disagrees with the identity inside.
    const swapped = await fresh();
    const w = path.join(swapped, WAVE);
    fs.renameSync(path.join(w, 'dp0_tp1_pp0_cp0'), path.join(w, 'x'));
    fs.renameSync(path.join(w, 'dp1_tp0_pp0_cp0'), path.join(w, 'dp0_tp1_pp0_cp0'));
    fs.renameSync(path.join(w, 'x'), path.join(w, 'dp1_tp0_pp0_cp0'));
    p = inspectTree(swapped).problems;
    expect(p).toContain(`${WAVE}/dp0_tp1_pp0_cp0: directory "dp0_tp1_pp0_cp0" disagrees with its dump.json (global rank 2, dp1_tp0_pp0_cp0)`);
    expect(p).toContain(`${WAVE}/dp1_tp0_pp0_cp0: directory "dp1_tp0_pp0_cp0" disagrees with its dump.json (global rank 1, dp0_tp1_pp0_cp0)`);
    expect(p).toContain(`${WAVE}: rank 1 missing: no dp0_tp1_pp0_cp0/dump.json`);
    // A layout that does not hold the dir (tp=1): the dir lies outside it.
    const narrow = await fresh();
    for (const f of ['request_info.json', 'manifest.json']) {
      const j = path.join(narrow, WAVE, f);
      const doc = JSON.parse(fs.readFileSync(j, 'utf8'));
      doc.layout = { world_size: 2, tp: 1, pp: 1, dp: 2, cp: 1 };
      fs.writeFileSync(j, JSON.stringify(doc));
    }
    p = inspectTree(narrow).problems;
    expect(p).toContain(`${WAVE}/dp0_tp1_pp0_cp0: KV dump directory "dp0_tp1_pp0_cp0" lies outside the layout tp=1 pp=1 dp=2 cp=1`);
    expect(runWavebus(['inspect', narrow]).code).toBe(1);
  });

  test("an aggregate's manifest: its missing ranks and failed files are problems", async () => {
    const root = await fresh();
    fs.writeFileSync(
      path.join(root, 'manifest.json'),
      JSON.stringify({
        kind: 'wavebus_aggregate',
        schema: 1,
        expected_ranks: [0, 1, 2, 3],
        present_ranks: [0, 1, 2],
        missing_ranks: [3],
        ranks: { '3': { answered: false, files: 0, bytes: 0, errors: ['not live on the bus'] } },
        files: [{ root: 'dumps', path: 'x/rank0/a.npy', bytes: 4, checksum: 'crc32c:00000000', status: 'failed', error: 'whole-file checksum mismatch' }],
        refused: [],
      }),
    );
    const r = inspectTree(root);
    expect(r.problems).toEqual(['.: rank 3 missing from the aggregate (not live on the bus)', 'dumps/x/rank0/a.npy: not aggregated (whole-file checksum mismatch)']);
    expect(r.bundles.find((b) => b.kind === 'aggregate')!.ranks).toEqual([0, 1, 2]);
    expect(runWavebus(['inspect', root]).code).toBe(1);
    expect(runWavebus(['inspect', path.join(root, 'nope')]).code).toBe(1);
  });

  test('a manifest entry that is not an object, or a list that is not one, is a problem named by field, never a TypeError', async () => {
    // The report_tree fuzz found `null` in a dump manifest's files throwing in inspect (and report).
    const root = await fresh();
    const mf = path.join(root, WAVE, 'manifest.json');
    const m = JSON.parse(fs.readFileSync(mf, 'utf8'));
    m.files['0'] = [null, ...m.files['0'], 7];
    m.files['1'] = 'a/b';
    fs.writeFileSync(mf, JSON.stringify(m));
    fs.writeFileSync(path.join(root, 'manifest.json'), JSON.stringify({ kind: 'wavebus_aggregate', present_ranks: 'all', missing_ranks: 5, files: [null], missing_files: [null], refused: {} }));
    const r = inspectTree(root);
    expect(r.problems).toEqual(
      expect.arrayContaining([
        `${WAVE}/manifest.json: files.0[0] is not an object`,
        `${WAVE}/manifest.json: files.0[${m.files['0'].length - 1}] is not an object`,
        `${WAVE}/manifest.json: files.1 is not a list`,
        'manifest.json: present_ranks is not a list of ranks',
        'manifest.json: missing_ranks is not a list of ranks',
        'manifest.json: files[0] is not an object',
        'manifest.json: missing_files[0] is not an object',
        'manifest.json: refused is not a list',
      ]),
    );
    expect(cli(root).code).toBe(1);
  });
});
