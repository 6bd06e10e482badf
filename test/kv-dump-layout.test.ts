// The KV dump layout users see (runtime-guard seed, "On-disk layout"): each rank's directory is
// dp<d>_tp<t>_pp<p>_cp<c>, built and parsed in one place (src/paths.ts); request_info.json and
// manifest.json carry the layout, the manifest each rank's directory. rank<g> of older dumps is read.
import * as fs from 'fs';
import * as path from 'path';
import { KvDirNameError } from '../src/errors';
import { DumpLedger } from '../src/guard/dump-ledger';
import { lastPpRanks, rankCoordinates, type WorldLayout } from '../src/layout';
import {
  checkKvDirIdentity,
  inKvRankDirOf,
  kvRankDirFor,
  kvRankDirName,
  kvRankOfDir,
  layoutJson,
  parseKvRankDirName,
  rankDirName,
  readKvRankDirName,
  readLayoutJson,
} from '../src/paths';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

const L: WorldLayout = { worldSize: 24, tp: 2, pp: 3, dp: 2, cp: 2 };

function refusal(f: () => unknown): KvDirNameError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(KvDirNameError);
    return e as KvDirNameError;
  }
  throw new Error('expected a KvDirNameError');
}

describe('KV dump directory names', () => {
  test('built from the coordinates, parsed back; every rank of a layout has its own name and maps back to its global rank', () => {
    expect(kvRankDirName({ dpRank: 1, tpRank: 3, ppRank: 0, cpRank: 2 })).toBe('dp1_tp3_pp0_cp2');
    expect(parseKvRankDirName('dp1_tp3_pp0_cp2')).toEqual({ dpRank: 1, tpRank: 3, ppRank: 0, cpRank: 2 });
    expect(parseKvRankDirName('dp65535_tp0_pp0_cp0').dpRank).toBe(65535);
    const names = new Set<string>();
    for (let g = 0; g < L.worldSize; g++) {
      const name = kvRankDirFor(g, L);
      const c = rankCoordinates(g, L);
      expect(name).toBe(`dp${c.dpRank}_tp${c.tpRank}_pp${c.ppRank}_cp${c.cpRank}`);
      expect(kvRankOfDir(readKvRankDirName(name), L)).toBe(g);
      names.add(name);
    }
    expect(names.size).toBe(L.worldSize);
    // Snapshots keep rank<g> (their own seed): the builder of that name is unchanged.
    expect(rankDirName(7)).toBe('rank7');
  });

  test('bad names are refused with ERR_KV_DIR_NAME naming the directory: leading zeros, signs, other orders, missing parts, out of bounds', () => {
    for (const bad of ['dp01_tp0_pp0_cp0', 'dp0_tp00_pp0_cp0', 'dp-1_tp0_pp0_cp0', 'dp+1_tp0_pp0_cp0', 'tp0_dp0_pp0_cp0', 'dp0_tp0_pp0', 'dp0_tp0_pp0_cp0_', ' dp0_tp0_pp0_cp0', 'dp0_tp0_pp0_cp0\n', 'dp1e3_tp0_pp0_cp0', 'DP0_TP0_PP0_CP0', 'dp0_tp0_pp0_cp１', '']) {
      const e = refusal(() => parseKvRankDirName(bad, 'wave_4: KV dump directory'));
      expect(e.code).toBe('ERR_KV_DIR_NAME');
      expect(e.message).toBe(`wave_4: KV dump directory ${JSON.stringify(bad)} is not dp<d>_tp<t>_pp<p>_cp<c> (decimal, no leading zeros)`);
    }
    expect(refusal(() => parseKvRankDirName('dp0_tp65536_pp0_cp0')).message).toBe('KV dump directory "dp0_tp65536_pp0_cp0": tpRank 65536 is over 65535 (MAX_WORLD_SIZE - 1)');
    expect(refusal(() => parseKvRankDirName('dp0_tp9999999_pp0_cp0')).message).toMatch(/is not dp<d>_tp<t>_pp<p>_cp<c>/);
    // A very long name is cut in the message.
    expect(refusal(() => parseKvRankDirName('x'.repeat(5000))).message.length).toBeLessThan(200);
    // The builder refuses what the parser would.
    expect(refusal(() => kvRankDirName({ dpRank: -1, tpRank: 0, ppRank: 0, cpRank: 0 })).message).toBe('dpRank must be an integer in 0..65535, got -1');
    expect(refusal(() => kvRankDirName({ dpRank: 0, tpRank: 1.5, ppRank: 0, cpRank: 0 })).message).toBe('tpRank must be an integer in 0..65535, got 1.5');
    expect(refusal(() => kvRankDirName({ dpRank: 0, tpRank: 0, ppRank: 65536, cpRank: 0 })).message).toBe('ppRank must be an integer in 0..65535, got 65536');
  });

  test("readers accept the seed's name and rank<g> of older dumps, nothing else; a seed name outside the layout is refused", () => {
    expect(readKvRankDirName('dp0_tp1_pp2_cp0')).toEqual({ name: 'dp0_tp1_pp2_cp0', coords: { dpRank: 0, tpRank: 1, ppRank: 2, cpRank: 0 } });
    expect(readKvRankDirName('rank12')).toEqual({ name: 'rank12', legacyRank: 12 });
    expect(kvRankOfDir(readKvRankDirName('rank12'), L)).toBe(12);
    for (const bad of ['rank012', 'rank', 'rank-1', 'Rank1', 'call3', 'rank1x']) {
      expect(refusal(() => readKvRankDirName(bad)).message).toBe(`KV dump directory ${JSON.stringify(bad)} is not dp<d>_tp<t>_pp<p>_cp<c> (decimal, no leading zeros) (nor rank<g> of an older wavebus)`);
    }
    expect(refusal(() => readKvRankDirName('rank70000')).message).toBe('KV dump directory "rank70000": rank 70000 is over 65535 (MAX_WORLD_SIZE - 1)');
    expect(refusal(() => kvRankOfDir(readKvRankDirName('dp0_tp2_pp0_cp0'), L)).message).toBe('KV dump directory "dp0_tp2_pp0_cp0" lies outside the layout tp=2 pp=3 dp=2 cp=2');
  });

  test("a directory's name must agree with the dump.json identity inside it", () => {
    const id = { global_rank: 13, dp_rank: 1, tp_rank: 1, pp_rank: 0, cp_rank: 0 };
    expect(kvRankDirFor(13, L)).toBe('dp1_tp1_pp0_cp0');
    expect(() => checkKvDirIdentity(readKvRankDirName('dp1_tp1_pp0_cp0'), id)).not.toThrow();
    expect(() => checkKvDirIdentity(readKvRankDirName('rank13'), id)).not.toThrow();
    expect(refusal(() => checkKvDirIdentity(readKvRankDirName('dp1_tp0_pp0_cp0'), id)).message).toBe('KV dump directory "dp1_tp0_pp0_cp0" disagrees with its dump.json (global rank 13, dp1_tp1_pp0_cp0)');
    expect(refusal(() => checkKvDirIdentity(readKvRankDirName('rank12'), id)).message).toBe('KV dump directory "rank12" disagrees with its dump.json (global rank 13, rank13)');
    expect(refusal(() => checkKvDirIdentity(readKvRankDirName('dp1_tp1_pp0_cp0'), { global_rank: 13, tp_rank: 1 })).message).toBe('KV dump directory "dp1_tp1_pp0_cp0": its dump.json identity: dpRank must be an integer in 0..65535, got undefined');
    expect(refusal(() => checkKvDirIdentity(readKvRankDirName('rank13'), {})).message).toBe('KV dump directory "rank13": its dump.json has no identity.global_rank');
  });

  test('which rank wrote a listed path: its own dir of either layout; the seed name needs the layout', () => {
    expect(inKvRankDirOf('t/r/wave_1/dp1_tp1_pp0_cp0/a.pt', 13, L)).toBe(true);
    expect(inKvRankDirOf('t/r/wave_1/dp1_tp1_pp0_cp0/a.pt', 12, L)).toBe(false);
    expect(inKvRankDirOf('t/r/wave_1/dp1_tp1_pp0_cp0/a.pt', 13, undefined)).toBe(false);
    expect(inKvRankDirOf('t/r/wave_1/rank13/a.pt', 13, undefined)).toBe(true);
    expect(inKvRankDirOf('t/r/wave_1/dp9_tp1_pp0_cp0/a.pt', 13, L)).toBe(false); // outside the layout
    expect(inKvRankDirOf('t/r/wave_1/request_info.json', 0, L)).toBe(false);
  });

  test('the recorded layout: written as {world_size, tp, pp, dp, cp}, read back checked', () => {
    expect(layoutJson(L)).toEqual({ world_size: 24, tp: 2, pp: 3, dp: 2, cp: 2 });
    expect(readLayoutJson(layoutJson(L))).toEqual({ layout: L });
    expect(readLayoutJson({ world_size: 5, tp: 2, pp: 3, dp: 2, cp: 2 })).toEqual({ reason: 'layout world_size 5 is not tp*pp*dp*cp = 24' });
    expect(readLayoutJson({ world_size: 2 ** 17, tp: 2 ** 17, pp: 1, dp: 1, cp: 1 })).toEqual({ reason: 'layout world_size 131072 is over 65536 (MAX_WORLD_SIZE)' });
    for (const bad of [null, 'tp2', [], { tp: 0, pp: 1, dp: 1, cp: 1, world_size: 0 }, { tp: '2', pp: 1, dp: 1, cp: 1, world_size: 2 }, { tp: 2, pp: 1, dp: 1, world_size: 2 }]) {
      const r = readLayoutJson(bad);
      expect('reason' in r && r.reason).toMatch(/^layout .* is not \{world_size, tp, pp, dp, cp\} of positive integers$/);
    }
  });
});

describe('request_info.json and manifest.json carry the layout and each rank directory', () => {
  test('a tp=2 pp=2 dp=2 job: replica 1\'s dump expects its last PP stage, each rank with its dp1_tp*_pp1_cp0 directory', () => {
    const layout: WorldLayout = { worldSize: 8, tp: 2, pp: 2, dp: 2, cp: 1 };
    expect(lastPpRanks(layout)).toEqual([2, 3, 6, 7]);
    const root = tmpDir('wavebus-kvlayout-');
    const ledger = new DumpLedger({ layout, ackTimeoutMs: 60000 });
    const job = ledger.arm(root, { incidentType: 'token_repeat', reqId: 'r1', blockIds: [1], detectWave: 3, armWave: 4, requestFinishedAtDump: false, replica: 1, info: {} })!;
    ledger.published(4, [job]);
    const info = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'request_info.json'), 'utf8'));
    expect(info.layout).toEqual({ world_size: 8, tp: 2, pp: 2, dp: 2, cp: 1 });
    for (const g of [6, 7]) {
      const dir = kvRankDirFor(g, layout);
      expect(ledger.ack({ globalRank: g, jobId: job.jobId, wave: 4, files: [{ path: `${dir}/dump.json`, bytes: 1, checksum: 'crc32c:00000000' }], bytes: 1, error: '', skippedReason: '' })).toBe('counted');
    }
    const m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
    expect(m.complete).toBe(true);
    expect(m.layout).toEqual(info.layout);
    // Keyed by global rank; the directory each rank wrote, without recomputing it.
    expect(m.dirs).toEqual({ 6: 'dp1_tp0_pp1_cp0', 7: 'dp1_tp1_pp1_cp0' });
    ledger.clear();
  });

  test('without a layout (a ledger built without one) neither file claims one', () => {
    const root = tmpDir('wavebus-kvlayout-');
    const ledger = new DumpLedger({ ackTimeoutMs: 60000 });
    const job = ledger.arm(root, { incidentType: 't', reqId: 'r', blockIds: [0], detectWave: 0, armWave: 1, requestFinishedAtDump: false, replica: 0, info: {} })!;
    ledger.published(1, [job]);
    ledger.ack({ globalRank: 0, jobId: job.jobId, wave: 1, files: [], bytes: 0, error: '', skippedReason: '' });
    const m = JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'manifest.json'), 'utf8'));
    expect(m.layout).toBeUndefined();
    expect(m.dirs).toBeUndefined();
    expect(JSON.parse(fs.readFileSync(path.join(job.dumpDir, 'request_info.json'), 'utf8')).layout).toBeUndefined();
    ledger.clear();
  });
});
