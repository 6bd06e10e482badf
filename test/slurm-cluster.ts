// A real one-node Slurm cluster for tests, started as root entirely under a private temp dir:
// munged with its own key and socket, slurmctld and slurmd in the foreground on free ports, the
// node registered as idle. Clients find it through SLURM_CONF (env()). stop() cancels every job
// and ends exactly the daemons started here (by pid, never by name).
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { freePortPair, spawnTracked, waitFor, type Spawned } from './helpers';

/** The programs a cluster needs, with the Debian package that has each. */
export const SLURM_PROGRAMS: [program: string, pkg: string][] = [
  ['munged', 'munge'], ['mungekey', 'munge'], ['munge', 'munge'],
  ['slurmctld', 'slurmctld'], ['slurmd', 'slurmd'], ['srun', 'slurm-client'], ['sbatch', 'slurm-client'],
  ['sinfo', 'slurm-client'], ['scancel', 'slurm-client'], ['squeue', 'slurm-client'], ['scontrol', 'slurm-client'],
];

/** The program's path: on PATH, else in the sbin directories a non-login PATH may lack. */
function which(program: string): string | undefined {
  const dirs = (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/sbin']).filter((d) => d !== '');
  return dirs.map((d) => path.join(d, program)).find((f) => fs.existsSync(f));
}

function bin(program: string): string {
  return which(program) ?? program;
}

/** Why a cluster cannot start here (missing programs, not root), or undefined. */
export function slurmMissing(): string | undefined {
  const missing = SLURM_PROGRAMS.filter(([p]) => which(p) === undefined);
  if (missing.length > 0) {
    const pkgs = [...new Set(missing.map(([, p]) => p))].join(' ');
    return `Slurm test: missing ${missing.map(([p]) => p).join(', ')}; install the Debian packages: apt-get install slurm-wlm munge (${pkgs})`;
  }
  if (process.getuid?.() !== 0) return `Slurm test: must run as root to start munged, slurmctld and slurmd (uid ${process.getuid?.()})`;
  return undefined;
}

export interface SlurmCluster {
  dir: string;
  host: string;
  conf: string;
  /** The environment Slurm clients (sbatch, srun, sinfo) need to reach this cluster. */
  env(extra?: NodeJS.ProcessEnv): NodeJS.ProcessEnv;
  /** Run a client to completion; throws with its output when it fails. */
  client(cmd: string, args: string[], timeoutMs?: number): string;
  /** The daemons' logs, for a failure message. */
  logs(): string;
  stop(): Promise<void>;
}

function tail(file: string, n = 3000): string {
  try {
    const s = fs.readFileSync(file, 'utf8');
    return s.slice(-n);
  } catch {
    return '(none)';
  }
}

/** Start munged, slurmctld and slurmd under `dir` (which must exist) and wait for the node to be idle. */
export async function startSlurmCluster(dir: string, opts: { cpus: number }): Promise<SlurmCluster> {
  const why = slurmMissing();
  if (why) throw new Error(why);
  const host = os.hostname().split('.')[0];
  const p = (...x: string[]) => path.join(dir, ...x);
  for (const d of ['munge', 'state', 'spool', 'log']) fs.mkdirSync(p(d), { recursive: true, mode: 0o700 });
  const daemons: { name: string; proc: Spawned }[] = [];
  const logs = () =>
    [
      ...daemons.map((d) => `--- ${d.name} (stderr)\n${d.proc.stderr().slice(-2000)}`),
      `--- slurmctld.log\n${tail(p('log', 'slurmctld.log'))}`,
      `--- slurmd.log\n${tail(p('log', 'slurmd.log'))}`,
      `--- munged.log\n${tail(p('log', 'munged.log'), 1000)}`,
    ].join('\n');
  const conf = p('slurm.conf');
  const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({ ...process.env, SLURM_CONF: conf, ...extra });
  const client = (cmd: string, args: string[], timeoutMs = 20000): string => {
    const r = spawnSync(bin(cmd), args, { encoding: 'utf8', env: env(), cwd: dir, timeout: timeoutMs });
    if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status ?? r.signal}: ${(r.stderr || r.error?.message || '').trim()}`);
    return r.stdout;
  };
  let jobsSeen = false;
  const stop = async (): Promise<void> => {
    // Cancel every job first, so slurmd ends their steps (slurmstepd) before it goes itself.
    if (jobsSeen && daemons.some((d) => d.name === 'slurmctld')) {
      try {
        client('scancel', ['--full', '--user', 'root'], 10000);
        await waitFor(() => client('squeue', ['-h', '-o', '%i'], 10000).trim() === '', 'every job to end after scancel', 20000);
      } catch {
        /* the daemons go anyway */
      }
    }
    for (const d of daemons.reverse()) {
      if (d.proc.child.exitCode !== null || d.proc.child.signalCode !== null) continue;
      d.proc.child.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const gone = await Promise.race([d.proc.exited.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), 10000)))]);
      clearTimeout(timer);
      if (!gone) {
        d.proc.child.kill('SIGKILL');
        await d.proc.exited;
      }
    }
  };
  const start = (name: string, cmd: string, args: string[]) => {
    const proc = spawnTracked(bin(cmd), args, { cwd: dir, env: env() });
    daemons.push({ name, proc });
    return proc;
  };
  try {
    // munge: a fresh key, mode 0400, and a munged of our own (root; --force accepts our paths).
    const key = p('munge', 'munge.key');
    const sock = p('munge', 'munge.socket');
    const mk = spawnSync(bin('mungekey'), ['--create', '--keyfile', key], { encoding: 'utf8' });
    if (mk.status !== 0) throw new Error(`mungekey --create exited ${mk.status}: ${mk.stderr}`);
    fs.chmodSync(key, 0o400);
    const munged = start('munged', 'munged', [
      '--foreground', '--force', `--socket=${sock}`, `--key-file=${key}`, `--log-file=${p('log', 'munged.log')}`,
      `--pid-file=${p('munge', 'munged.pid')}`, `--seed-file=${p('munge', 'munged.seed')}`,
    ]);
    await waitFor(() => {
      if (munged.child.exitCode !== null) throw new Error(`munged exited ${munged.child.exitCode}`);
      return spawnSync(bin('munge'), ['--no-input', `--socket=${sock}`], { stdio: 'ignore' }).status === 0;
    }, 'munged to answer on its socket', 15000);

    // Two free ports below the ephemeral range (freePortPair): srun's and the daemons' own
    // connections draw their source ports from that range and could take one before its bind.
    const ctldPort = await freePortPair();
    const dPort = ctldPort + 1;
    fs.writeFileSync(conf, [
      'ClusterName=wavebus',
      // Daemons and clients talk over loopback only.
      `SlurmctldHost=${host}(127.0.0.1)`,
      `SlurmctldPort=${ctldPort}`,
      `SlurmdPort=${dPort}`,
      'SlurmUser=root',
      'SlurmdUser=root',
      'AuthType=auth/munge',
      `AuthInfo=socket=${sock}`,
      'CredType=cred/munge',
      `StateSaveLocation=${p('state')}`,
      `SlurmdSpoolDir=${p('spool')}`,
      `SlurmctldPidFile=${p('slurmctld.pid')}`,
      `SlurmdPidFile=${p('slurmd.pid')}`,
      `SlurmctldLogFile=${p('log', 'slurmctld.log')}`,
      `SlurmdLogFile=${p('log', 'slurmd.log')}`,
      'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none',
      'SelectType=select/cons_tres',
      'SelectTypeParameters=CR_Core',
      'MpiDefault=none',
      'SwitchType=switch/none',
      'JobCompType=jobcomp/none',
      'AccountingStorageType=accounting_storage/none',
      'JobAcctGatherType=jobacct_gather/none',
      'SchedulerType=sched/builtin',
      'MailProg=/bin/true',
      'ReturnToService=2',
      // The node may declare more CPUs than this machine has (4 tasks on a 2-core CI machine).
      'SlurmdParameters=config_overrides',
      `NodeName=${host} NodeAddr=127.0.0.1 CPUs=${opts.cpus} RealMemory=256 State=UNKNOWN`,
      `PartitionName=debug Nodes=${host} Default=YES MaxTime=10 State=UP`,
      '',
    ].join('\n'));

    const ctld = start('slurmctld', 'slurmctld', ['-D', '-i', '-f', conf]);
    const slurmd = start('slurmd', 'slurmd', ['-D', '-f', conf]);
    jobsSeen = true;
    await waitFor(() => {
      for (const d of [ctld, slurmd]) if (d.child.exitCode !== null) throw new Error(`a Slurm daemon exited ${d.child.exitCode} while starting`);
      const r = spawnSync(bin('sinfo'), ['-h', '-N', '-o', '%N %t'], { encoding: 'utf8', env: env(), timeout: 10000 });
      return r.status === 0 && r.stdout.trim() === `${host} idle`;
    }, `sinfo to show node ${host} idle`, 30000);
  } catch (e) {
    const message = `${(e as Error).message}\n${logs()}`;
    await stop();
    throw new Error(`a one-node Slurm cluster could not start on this machine: ${message}`);
  }
  return { dir, host, conf, env, client, logs, stop };
}
