// `wavebus launch`: run once per host, like torchrun. Starts the coordinator (node 0) and one
// agent per local rank, waits until the bus is ready (by asking the coordinator, never by
// sleeping), runs the user's command with the wavebus environment, forwards signals to it, and
// tears everything down when it exits, exiting with its code.
import { createTokenHashKeyFile } from '../guard/token-hash';
import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { BusToken, createTokenFile, TOKEN_FD } from '../bus/auth';
import { readSecretFile, secretText } from '../artifacts/secret-file';
import { LaunchError } from '../errors';
import { loadCurveDirServer } from '../bus/curve';
import { checkBindAllowed, isLoopback } from '../bus/endpoints';
import { checkRunDirFits, packageRoot } from '../paths';
import { claimRunDir, makeRunDir, newShmPrefix, releaseRunDir, removeShmSegments, type RunDir } from './run-dir';
import type { Logger } from '../log';
import { checkPortFree, localBindAddress } from './coordinator-host';
import { launchError, type LaunchOptions } from './options';
import { waitForCoordinator, type StatusSnapshot } from './readiness';
import { Sidecar } from './sidecar';
import { CoordinatorKeeper } from './coordinator-keeper';
import { COORDINATOR_NODE_FLAGS } from '../bus/constants';
import { agentArgv, commandEnv, coordinatorArgv, globalRankOfLocal, launchDumpRoot } from './sidecar-args';

/**
 * The run dir: --run-dir created 0700 (or an existing one that is ours and 0700), else a fresh
 * unpredictable /dev/shm/wavebus-XXXXXX. Only a directory we created is removed at the end.
 */
function prepareRunDir(runDir: string | undefined, nproc: number): RunDir {
  if (runDir !== undefined) {
    checkRunDirFits(runDir, nproc - 1, '--run-dir', 'ERR_LAUNCH');
    return claimRunDir(runDir, '--run-dir');
  }
  return makeRunDir('wavebus-');
}

const SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

function signalExitCode(sig: NodeJS.Signals): number {
  return 128 + (os.constants.signals[sig] ?? 0);
}

/** Run the whole launch; resolves to the exit code the launcher should exit with. */
export async function launch(opts: LaunchOptions, logger?: Logger): Promise<number> {
  const bin = path.join(packageRoot(), 'bin', 'wavebus.js');
  const bindHost = opts.nodeRank === 0 ? await localBindAddress(opts.coordinator.host) : undefined;
  const startCoordinator = bindHost !== undefined;
  if (startCoordinator) {
    // A host name that resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts) would
    // bind where no other node can reach; an explicit loopback address is a deliberate one-host test.
    const named = net.isIP(opts.coordinator.host.replace(/^\[|\]$/g, '')) === 0 && opts.coordinator.host !== 'localhost';
    if (opts.nnodes > 1 && named && isLoopback(bindHost)) {
      throw launchError(
        `--nnodes ${opts.nnodes}: the coordinator host ${opts.coordinator.host} resolves to the loopback address ${bindHost} on this host, ` +
          'which other nodes cannot reach; pass --master-addr (or --coordinator) with an IP address of this host',
      );
    }
    // Fail before spawning anything when the coordinator's keys are unusable.
    const serverKeys = opts.curveDir !== undefined ? loadCurveDirServer(opts.curveDir) : undefined;
    // Named by where the address came from: the launcher has no --host.
    const where = `--master-addr / --coordinator ${opts.coordinator.host} (binds ${bindHost})`;
    checkBindAllowed(bindHost, { insecure: opts.insecure, curve: serverKeys !== undefined, logger, where });
    await checkPortFree(bindHost, opts.port, 'PUB');
    await checkPortFree(bindHost, opts.port + 1, 'ROUTER');
  } else if (opts.nodeRank === 0) {
    logger?.info({ coordinator: opts.coordinator }, 'the coordinator address is not on this host; expecting a coordinator there');
  }

  const rd = prepareRunDir(opts.runDir, opts.nprocPerNode);
  const runDir = rd.path;
  // The dump root is this host's decision, derived like the coordinator's (before anything starts).
  let dumpRoot: string;
  try {
    dumpRoot = launchDumpRoot(opts.coordinatorArgs);
  } catch (e) {
    releaseRunDir(rd);
    throw e;
  }
  // The engines name their shm segments with this prefix, so whatever kills them (SIGKILL
  // included), the launcher removes exactly this job's segments once the command is gone.
  const shmPrefix = newShmPrefix();
  const env: NodeJS.ProcessEnv = { ...commandEnv(opts, runDir), WAVEBUS_SHM_PREFIX: shmPrefix };
  const releaseShm = () => {
    const gone = removeShmSegments(shmPrefix);
    if (gone.length > 0) logger?.warn({ segments: gone }, 'removed shared memory the command left behind');
  };
  // Without CURVE, a one-host job's coordinator and agents share a fresh token (auth.ts), passed
  // by path. Several hosts cannot share a file from here: they use CURVE (docs/security.md).
  let tokenFile: string | undefined;
  let token: BusToken | undefined;
  // The token's text, read back once: the sidecars get it on a pipe (--bus-token-fd), so a
  // restarted coordinator never reads a path someone could have changed meanwhile.
  let tokenText: string | undefined;
  if (startCoordinator && opts.nnodes === 1 && opts.curveDir === undefined) {
    try {
      tokenFile = createTokenFile(opts.busTokenDir ?? runDir);
      const bytes = readSecretFile(tokenFile, opts.busTokenDir !== undefined ? '--bus-token-dir' : 'the bus token', 'the bus token');
      token = BusToken.fromBytes(bytes);
      tokenText = secretText(bytes);
    } catch (e) {
      releaseRunDir(rd);
      throw e;
    }
    env.WAVEBUS_BUS_TOKEN_FILE = tokenFile;
  }
  // report.save_sensitive_info "hashed": a per-job key, 0600 in the run dir, unless the user named
  // one (the same file for jobs whose reports are to be compared; docs/fingerprints.md). The agents
  // get it too (--token-hash-key-file): their recorder bundles hash with the same key. Not the
  // command: the key is as sensitive as the token ids, and the engine has no use for it.
  let hashKeyArgs: string[] = [];
  if (startCoordinator && !env.WAVEBUS_TOKEN_HASH_KEY_FILE && !opts.coordinatorArgs.some((a) => a.startsWith('--token-hash-key-file'))) {
    try {
      hashKeyArgs = ['--token-hash-key-file', createTokenHashKeyFile(runDir)];
    } catch (e) {
      releaseRunDir(rd);
      throw e;
    }
  }
  const sidecars: Sidecar[] = [];
  let command: ChildProcess | undefined;
  let keeper: CoordinatorKeeper | undefined;

  // Last line of defence: whatever happens to us, the sidecars do not outlive the launcher.
  const onExit = () => {
    for (const s of sidecars) if (s.alive()) s.signalGroup('SIGKILL');
    if (tokenFile) fs.rmSync(tokenFile, { force: true });
    removeShmSegments(shmPrefix);
    releaseRunDir(rd);
  };
  process.on('exit', onExit);

  let signalled: NodeJS.Signals | undefined;
  let abortStartup: (e: Error) => void = () => undefined;
  // A signal before the linger began (while the command ran, or between its exit and the linger):
  // the linger is skipped, never waited out.
  let stopped = false;
  let stopLinger: () => void = () => {
    stopped = true;
  };
  const onSignal = (sig: NodeJS.Signals) => {
    if (command && (command.exitCode !== null || command.signalCode !== null)) {
      stopLinger();
    } else if (command) {
      // Stopped while the command runs: it stops, and the agents do not linger after it.
      stopped = true;
      command.kill(sig);
    } else {
      signalled = sig;
      abortStartup(new LaunchError(`received ${sig} before the job was ready`, 'ERR_LAUNCH_SIGNAL'));
    }
  };
  for (const s of SIGNALS) process.on(s, onSignal);

  const teardown = async () => {
    keeper?.stop();
    await Promise.all(sidecars.map((s) => s.stop(opts.graceMs)));
    for (const s of SIGNALS) process.off(s, onSignal);
    if (tokenFile) fs.rmSync(tokenFile, { force: true });
    releaseShm();
    releaseRunDir(rd);
    process.off('exit', onExit);
  };

  try {
    const startupFailed = new Promise<never>((_, reject) => {
      abortStartup = reject;
    });
    startupFailed.catch(() => undefined);

    const tokenArgs = tokenText !== undefined ? ['--bus-token-fd', String(TOKEN_FD)] : [];
    const coordinatorSidecar = () => new Sidecar('coordinator', bin, [...coordinatorArgv(opts, bindHost!), ...tokenArgs, ...hashKeyArgs], env, COORDINATOR_NODE_FLAGS, tokenText);
    if (startCoordinator) sidecars.push(coordinatorSidecar());
    for (let l = 0; l < opts.nprocPerNode; l++) {
      sidecars.push(new Sidecar(`agent local${l}/rank${globalRankOfLocal(opts, l)}`, bin, [...agentArgv(opts, l, runDir, { dumpRoot, tokenHashKeyFile: hashKeyArgs[1] }), ...tokenArgs], env, [], tokenText));
    }
    for (const s of sidecars) {
      void s.exited.then(() => {
        const tail = s.stderrTail();
        // Name the flags that put arguments on its command line: a bad one shows up only there.
        const [extra, flag] = s.name === 'coordinator' ? [opts.coordinatorArgs, '--coordinator-arg'] : [opts.agentArgs, '--agent-arg'];
        const given = extra.length ? ` (started with the extra arguments ${JSON.stringify(extra)} from ${flag} and launch's own flags)` : '';
        abortStartup(new LaunchError(`${s.name} ${s.exitDescription()} before the job was ready${given}${tail ? `; its output ends with:\n${tail}` : ''}`));
      });
    }

    let lastStatus: StatusSnapshot | undefined;
    const timer = setTimeout(() => {
      const seen = lastStatus ? ` (live ranks [${lastStatus.liveRanks.join(',')}] of expected [${lastStatus.expectedRanks.join(',')}])` : ' (no answer from the coordinator)';
      abortStartup(
        new LaunchError(
          `the job was not ready after --ready-timeout-ms ${opts.readyTimeoutMs} ms: coordinator ${opts.coordinator.host}:${opts.coordinator.port}${seen}`,
          'ERR_LAUNCH_TIMEOUT',
        ),
      );
    }, opts.readyTimeoutMs);
    const mine = Array.from({ length: opts.nprocPerNode }, (_, l) => globalRankOfLocal(opts, l));
    try {
      const status = await waitForCoordinator(
        opts.coordinator,
        (s) => {
          lastStatus = s;
          // Node 0 waits for the whole job; other nodes only for their own agents that join the
          // bus (the last-PP ranks, which the coordinator expects; the others never say Hello).
          return opts.nodeRank === 0 ? s.ready : mine.filter((r) => s.expectedRanks.includes(r)).every((r) => s.liveRanks.includes(r));
        },
        startupFailed,
        opts.curve,
        token,
      );
      logger?.info({ liveRanks: status.liveRanks, epoch: status.epoch, runDir }, 'wavebus ready; starting the command');
    } finally {
      clearTimeout(timer);
    }
    if (signalled) throw new LaunchError(`received ${signalled} before the job was ready`, 'ERR_LAUNCH_SIGNAL');

    // From here on a sidecar dying is logged, never fatal: debugging must not stop the job. A dead
    // coordinator is started again (coordinator-keeper.ts); it is sidecars[0].
    if (startCoordinator) {
      keeper = new CoordinatorKeeper(
        sidecars[0],
        () => (sidecars[0] = coordinatorSidecar()),
        (line) => process.stderr.write(`wavebus launch: warning: ${line}\n`),
        async () => {
          try {
            await checkPortFree(bindHost!, opts.port, 'PUB');
            await checkPortFree(bindHost!, opts.port + 1, 'ROUTER');
            return undefined;
          } catch (e) {
            return (e as Error).message;
          }
        },
      );
      keeper.watch();
    }
    for (const s of sidecars) {
      if (s.name === 'coordinator') continue;
      void s.exited.then(() => {
        if (command && command.exitCode === null && command.signalCode === null) {
          process.stderr.write(`wavebus launch: warning: ${s.name} ${s.exitDescription()} while the command runs\n`);
        }
      });
    }

    const cmd = spawn(opts.command[0], opts.command.slice(1), { stdio: 'inherit', env });
    command = cmd;
    const result = await new Promise<number>((resolve) => {
      cmd.once('error', (e: NodeJS.ErrnoException) => {
        process.stderr.write(`wavebus launch: could not start the command ${JSON.stringify(opts.command[0])}: ${e.message}\n`);
        resolve(e.code === 'ENOENT' ? 127 : 126);
      });
      cmd.once('exit', (code, signal) => resolve(signal ? signalExitCode(signal) : (code ?? 1)));
    });
    releaseShm();
    if (opts.lingerMs && opts.lingerMs > 0 && !stopped) {
      // Agents keep serving their bundles so `wavebus aggregate` can still collect them.
      process.stderr.write(`wavebus launch: the command exited (${result}); agents keep serving files for ${opts.lingerMs} ms (SIGTERM stops them)\n`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, opts.lingerMs);
        stopLinger = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
    return result;
  } catch (e) {
    if (signalled && !command) {
      process.stderr.write(`wavebus launch: received ${signalled} before the job was ready; stopping\n`);
      return signalExitCode(signalled);
    }
    throw e;
  } finally {
    await teardown();
  }
}
