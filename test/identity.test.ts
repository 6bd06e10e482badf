// Rank identity: torchrun / Slurm / flags, TP-fastest coordinates, and every error.
import * as os from 'os';
import yargs from 'yargs';
import { ConfigError } from '../src/errors';
import { firstSlurmHost, identityFlagsFromArgv, identityOptions, resolveIdentity, resolveLayout, slurmTasksOnNode } from '../src/launch/identity';
import { globalRankOf, identityToProto, lastPpRanks, rankCoordinates, WorldLayout } from '../src/layout';
import { decode, encode, messageType } from '../src/proto';

const torchrun = (o: Record<string, string> = {}): NodeJS.ProcessEnv => ({
  RANK: '5',
  LOCAL_RANK: '1',
  WORLD_SIZE: '8',
  LOCAL_WORLD_SIZE: '4',
  GROUP_RANK: '1',
  MASTER_ADDR: '10.0.0.7',
  ...o,
});

const slurm = (o: Record<string, string> = {}): NodeJS.ProcessEnv => ({
  SLURM_PROCID: '6',
  SLURM_LOCALID: '2',
  SLURM_NTASKS: '8',
  SLURM_NODEID: '1',
  SLURM_TASKS_PER_NODE: '4(x2)',
  SLURM_JOB_NODELIST: 'gpu[03-04]',
  ...o,
});

function layout(tp: number, pp: number, dp: number, cp = 1): WorldLayout {
  return { worldSize: tp * pp * dp * cp, tp, pp, dp, cp };
}

function identityError(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    expect((e as ConfigError).code).toBe('ERR_IDENTITY');
    return e as ConfigError;
  }
  throw new Error('expected an ERR_IDENTITY error');
}

describe('sources', () => {
  test('torchrun environment', () => {
    const id = resolveIdentity(torchrun({ WAVEBUS_TP: '4', WAVEBUS_PP: '2' }));
    expect(id).toMatchObject({
      globalRank: 5,
      localRank: 1,
      worldSize: 8,
      localWorldSize: 4,
      nodeRank: 1,
      masterAddr: '10.0.0.7',
      tp: 4,
      pp: 2,
      dp: 1,
      cp: 1,
      tpRank: 1,
      ppRank: 1,
      dpRank: 0,
      cpRank: 0,
      isLastPp: true,
      host: os.hostname(),
    });
  });

  test('NODE_RANK is read when GROUP_RANK is absent', () => {
    const env = torchrun();
    delete env.GROUP_RANK;
    env.NODE_RANK = '1';
    expect(resolveIdentity(env).nodeRank).toBe(1);
  });

  test('Slurm environment, tasks per node from "4(x2)", master from the node list', () => {
    const id = resolveIdentity(slurm());
    expect(id).toMatchObject({ globalRank: 6, localRank: 2, worldSize: 8, localWorldSize: 4, nodeRank: 1, masterAddr: 'gpu03', tp: 8, tpRank: 6 });
  });

  test('Slurm launch node address wins over the node list; SLURM_NTASKS_PER_NODE over SLURM_TASKS_PER_NODE', () => {
    const id = resolveIdentity(slurm({ SLURM_LAUNCH_NODE_IPADDR: '10.1.2.3', SLURM_NTASKS_PER_NODE: '4', SLURM_TASKS_PER_NODE: 'garbage' }));
    expect(id.masterAddr).toBe('10.1.2.3');
    expect(id.localWorldSize).toBe(4);
  });

  test('torchrun variables win over Slurm ones (torchrun under srun)', () => {
    // srun runs one task per node: SLURM_PROCID is the node's task, RANK the real global rank.
    const env = { ...slurm({ SLURM_PROCID: '1', SLURM_NTASKS: '2', SLURM_LOCALID: '0', SLURM_TASKS_PER_NODE: '1(x2)' }), ...torchrun() };
    const id = resolveIdentity(env);
    expect(id).toMatchObject({ globalRank: 5, localRank: 1, worldSize: 8, localWorldSize: 4, nodeRank: 1, masterAddr: '10.0.0.7' });
  });

  test('flags override the environment', () => {
    const id = resolveIdentity(torchrun({ WAVEBUS_TP: '8' }), {
      rank: 2,
      localRank: 2,
      worldSize: 4,
      localWorldSize: 4,
      nodeRank: 0,
      masterAddr: 'head',
      tp: 2,
      pp: 2,
    });
    expect(id).toMatchObject({ globalRank: 2, localRank: 2, worldSize: 4, nodeRank: 0, masterAddr: 'head', tp: 2, pp: 2, tpRank: 0, ppRank: 1, isLastPp: true });
  });

  test('nothing set: a single process, rank 0 of 1, master 127.0.0.1', () => {
    expect(resolveIdentity({})).toMatchObject({ globalRank: 0, localRank: 0, worldSize: 1, localWorldSize: 1, nodeRank: 0, masterAddr: '127.0.0.1', tp: 1, isLastPp: true });
  });

  test('no local world size: one node holds the world; node rank derived', () => {
    expect(resolveIdentity({ RANK: '3', WORLD_SIZE: '4' })).toMatchObject({ localRank: 3, localWorldSize: 4, nodeRank: 0 });
    expect(resolveIdentity({ RANK: '5', WORLD_SIZE: '8', LOCAL_WORLD_SIZE: '4' })).toMatchObject({ localRank: 1, nodeRank: 1 });
  });
});

describe('layout', () => {
  test('no sizes given: tp = world size', () => {
    expect(resolveLayout({ WORLD_SIZE: '8' })).toEqual({ worldSize: 8, tp: 8, pp: 1, dp: 1, cp: 1 });
  });

  test('some sizes given: the others default to 1, and must multiply to the world size', () => {
    expect(resolveLayout({ WORLD_SIZE: '8', WAVEBUS_TP: '4', WAVEBUS_DP: '2' })).toEqual({ worldSize: 8, tp: 4, pp: 1, dp: 2, cp: 1 });
  });

  test('sizes without a world size give the world size', () => {
    expect(resolveLayout({}, { tp: 2, pp: 3 })).toEqual({ worldSize: 6, tp: 2, pp: 3, dp: 1, cp: 1 });
  });

  test('flags override WAVEBUS_* sizes', () => {
    expect(resolveLayout({ WORLD_SIZE: '8', WAVEBUS_TP: '8' }, { tp: 4, pp: 2 })).toEqual({ worldSize: 8, tp: 4, pp: 2, dp: 1, cp: 1 });
  });
});

describe('TP-fastest rank order (vLLM)', () => {
  test.each([
    // [tp, pp, dp, cp, global, tpRank, ppRank, dpRank, cpRank]
    [2, 2, 2, 1, 5, 1, 0, 1, 0],
    [2, 2, 2, 1, 3, 1, 1, 0, 0],
    [2, 2, 2, 1, 6, 0, 1, 1, 0],
    [8, 2, 1, 1, 9, 1, 1, 0, 0],
    [4, 1, 2, 1, 6, 2, 0, 1, 0],
    [2, 2, 1, 2, 5, 1, 1, 0, 0],
    [2, 2, 1, 2, 2, 0, 0, 0, 1],
    [2, 1, 2, 2, 7, 1, 0, 1, 1],
    [1, 4, 1, 1, 3, 0, 3, 0, 0],
  ])('tp%i pp%i dp%i cp%i: rank %i -> tp%i pp%i dp%i cp%i', (tp, pp, dp, cp, g, tpR, ppR, dpR, cpR) => {
    const l = layout(tp, pp, dp, cp);
    const c = rankCoordinates(g, l);
    expect(c).toEqual({ tpRank: tpR, ppRank: ppR, dpRank: dpR, cpRank: cpR, isLastPp: ppR === pp - 1 });
    expect(((dpR * pp + ppR) * cp + cpR) * tp + tpR).toBe(g);
  });

  test('every rank of several layouts round-trips, and coordinates are unique', () => {
    for (const l of [layout(2, 2, 2), layout(4, 2, 1, 2), layout(1, 1, 3), layout(3, 2, 2, 2)]) {
      const seen = new Set<string>();
      for (let g = 0; g < l.worldSize; g++) {
        const c = rankCoordinates(g, l);
        expect(globalRankOf(c, l)).toBe(g);
        seen.add(`${c.tpRank}/${c.ppRank}/${c.dpRank}/${c.cpRank}`);
      }
      expect(seen.size).toBe(l.worldSize);
    }
  });

  test('lastPpRanks', () => {
    expect(lastPpRanks(layout(2, 2, 2))).toEqual([2, 3, 6, 7]);
    expect(lastPpRanks(layout(8, 2, 1))).toEqual([8, 9, 10, 11, 12, 13, 14, 15]);
    expect(lastPpRanks(layout(4, 1, 1))).toEqual([0, 1, 2, 3]);
    expect(lastPpRanks(layout(2, 2, 1, 2))).toEqual([4, 5, 6, 7]);
    expect(lastPpRanks(layout(1, 3, 2))).toEqual([2, 5]);
  });

  test('a rank outside the layout is refused', () => {
    expect(identityError(() => rankCoordinates(8, layout(2, 2, 2))).message).toMatch(/global rank 8 is outside/);
  });
});

describe('errors name the value and where it came from', () => {
  test.each([
    ['non-integer RANK', torchrun({ RANK: 'abc' }), /RANK='abc' is not a non-negative integer/],
    ['negative RANK', torchrun({ RANK: '-1' }), /RANK='-1' is not a non-negative integer/],
    ['fractional LOCAL_RANK', torchrun({ LOCAL_RANK: '1.5' }), /LOCAL_RANK='1.5' is not a non-negative integer/],
    ['zero WORLD_SIZE', torchrun({ WORLD_SIZE: '0' }), /WORLD_SIZE='0' is not a positive integer/],
    ['WAVEBUS_TP=x', torchrun({ WAVEBUS_TP: 'x' }), /WAVEBUS_TP='x' is not a positive integer/],
    ['WAVEBUS_PP=0', torchrun({ WAVEBUS_PP: '0' }), /WAVEBUS_PP='0' is not a positive integer/],
    ['rank >= world', torchrun({ RANK: '8' }), /RANK=8 is not below the world size WORLD_SIZE\(8\)/],
    ['local rank >= local world', torchrun({ LOCAL_RANK: '4' }), /LOCAL_RANK=4 is not below the local world size LOCAL_WORLD_SIZE\(4\)/],
    ['local world > world', torchrun({ LOCAL_WORLD_SIZE: '16' }), /LOCAL_WORLD_SIZE=16 exceeds the world size WORLD_SIZE\(8\)/],
    [
      'inconsistent sizes',
      torchrun({ WAVEBUS_TP: '2', WAVEBUS_PP: '2' }),
      /tp\(2\)\*pp\(2\)\*dp\(1\)\*cp\(1\)=4 != WORLD_SIZE\(8\) \[tp from WAVEBUS_TP, pp from WAVEBUS_PP, dp from default 1, cp from default 1\]/,
    ],
    ['GROUP_RANK and NODE_RANK disagree', torchrun({ NODE_RANK: '0' }), /GROUP_RANK=1 and NODE_RANK=0 disagree/],
    ['bad SLURM_TASKS_PER_NODE', slurm({ SLURM_TASKS_PER_NODE: '4(y2)' }), /SLURM_TASKS_PER_NODE='4\(y2\)' is not a Slurm task count list/],
    ['SLURM_NODEID past the task list', slurm({ SLURM_TASKS_PER_NODE: '4', SLURM_NODEID: '1' }), /lists fewer nodes than SLURM_NODEID=1/],
    ['world of many without a rank', { WORLD_SIZE: '4' }, /no global rank for a world of 4/],
    ['RANK (torchrun) mixed with SLURM_NTASKS', { RANK: '1', SLURM_NTASKS: '2' }, /RANK=1 comes from torchrun but SLURM_NTASKS=2 comes from slurm/],
    ['LOCAL_RANK (torchrun) mixed with SLURM_NTASKS_PER_NODE', { RANK: '1', WORLD_SIZE: '2', LOCAL_RANK: '1', SLURM_NTASKS_PER_NODE: '1' }, /LOCAL_RANK=1 comes from torchrun but SLURM_NTASKS_PER_NODE=1/],
  ])('%s', (_name, env, re) => {
    expect(identityError(() => resolveIdentity(env)).message).toMatch(re);
  });

  test('flag errors name the flag', () => {
    expect(identityError(() => resolveIdentity({}, { rank: -2 })).message).toMatch(/--rank=-2 is not a non-negative integer/);
    expect(identityError(() => resolveIdentity({ WORLD_SIZE: '4', RANK: '0' }, { tp: 3 })).message).toMatch(/tp\(3\).*=3 != WORLD_SIZE\(4\).*tp from --tp/);
    expect(identityError(() => resolveIdentity({ RANK: '0' }, { worldSize: 2, tp: 4 })).message).toMatch(/=4 != --world-size\(2\)/);
  });
});

describe('Slurm helpers', () => {
  test('task counts per node', () => {
    expect(slurmTasksOnNode('4(x2),3', 0)).toBe(4);
    expect(slurmTasksOnNode('4(x2),3', 1)).toBe(4);
    expect(slurmTasksOnNode('4(x2),3', 2)).toBe(3);
    expect(slurmTasksOnNode('2,8', 1)).toBe(8);
  });

  test('first host of a node list', () => {
    expect(firstSlurmHost('gpu[03-05,09],cpu1')).toBe('gpu03');
    expect(firstSlurmHost('node7,node8')).toBe('node7');
    expect(firstSlurmHost('single')).toBe('single');
    expect(firstSlurmHost('')).toBeUndefined();
  });
});

describe('flags and proto', () => {
  function parse(args: string[]): Record<string, unknown> {
    return yargs(args).options(identityOptions).strict().parseSync() as Record<string, unknown>;
  }

  test('identityFlagsFromArgv parses yargs output and keeps only what was given', () => {
    const f = identityFlagsFromArgv(parse(['--rank', '3', '--world-size', '4', '--tp', '2', '--pp', '2', '--master-addr', 'h0', '--local-rank', '3']));
    expect(f).toEqual({ rank: 3, worldSize: 4, tp: 2, pp: 2, masterAddr: 'h0', localRank: 3 });
    expect(resolveIdentity({}, f)).toMatchObject({ globalRank: 3, tpRank: 1, ppRank: 1, isLastPp: true });
  });

  test('a bad flag value is quoted back with the flag name', () => {
    expect(identityError(() => identityFlagsFromArgv(parse(['--rank', 'abc']))).message).toBe("--rank='abc' is not a non-negative integer");
    expect(identityError(() => identityFlagsFromArgv(parse(['--tp', '0']))).message).toBe("--tp='0' is not a positive integer");
  });

  test('identityToProto encodes as wavebus.RankIdentity and round-trips', () => {
    const id = resolveIdentity(torchrun({ WAVEBUS_TP: '4', WAVEBUS_PP: '2' }));
    const T = messageType('RankIdentity');
    const back = decode(T, encode(T, identityToProto(id)));
    expect(back).toEqual({
      globalRank: 5,
      localRank: 1,
      worldSize: 8,
      localWorldSize: 4,
      nodeRank: 1,
      tpRank: 1,
      ppRank: 1,
      dpRank: 0,
      cpRank: 0,
      tpSize: 4,
      ppSize: 2,
      dpSize: 1,
      cpSize: 1,
      isLastPp: true,
      host: os.hostname(),
      pid: process.pid,
    });
  });
});
