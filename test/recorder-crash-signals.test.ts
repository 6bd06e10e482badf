// How the engine died, as the flight recorder's crash record says it (docs/recorder.md, "How it
// died"): a real agent (this process, the recorder on) and a real Python engine process using the
// client. A socket closed without goodbye while the process lives on is a death (the connection
// was the engine's only way to the agent); a SIGSEGV is named with the engine's own traceback
// (Python's faulthandler, pointed at the run dir by the client); an engine in another pid
// namespace, whose pid means nothing here, is seen dying by its connection alone; a clean close is
// no crash.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import pino from 'pino';
import { Agent } from '../src/agent/agent';
import { readEngineFault } from '../src/agent/engine-fault';
import { resolveIdentity } from '../src/launch/identity';
import { engineFaultPath } from '../src/paths';
import { PYTHON, ROOT, cleanup, describeAsRoot, spawnTracked, tmpDir, waitFor } from './helpers';

afterAll(cleanup);

const ENV: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path.join(ROOT, 'clients', 'python'), PYTHONDONTWRITEBYTECODE: '1' };

// Three forwards recorded, then: "segv" (a NULL read in crash_here), "drop" (the client's socket
// closed, no goodbye, the process kept alive), "exit" (os._exit: no word), "clean" (close(), then alive a while).
const ENGINE = `import ctypes, json, os, resource, sys, time, torch
from wavebus_client import Client
from wavebus_client.shm import shm_tensor, release
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the SIGSEGV
run_dir, mode, shm = sys.argv[1], sys.argv[2], sys.argv[3]
c = Client.connect(env={"WAVEBUS_RUN_DIR": run_dir, "LOCAL_RANK": "0"})
t, r = shm_tensor(shm, [64], torch.int64, region_name="ids")
c.register(r)
c.hello()
for i in range(3):
    t.fill_(i + 1)
    c.before_forward({"compilation_hash": "crashsig", "global_step": i + 1, "req_ids": ["r"], "positions": [0]}, [t])
print(json.dumps({"pid": os.getpid(), "fault_file": c.fault_file, "recorded": c.stats.get("recorded", 0)}), flush=True)

def crash_here():
    ctypes.string_at(0)

if mode == "segv":
    crash_here()
elif mode == "drop":
    c._sock._sock.close(0)  # the connection goes, the process stays
    time.sleep(60)
elif mode == "exit":
    os._exit(3)
c.close()
release(r)
print("closed", flush=True)
time.sleep(1.5)  # alive past the agent's grace after its connection went
`;

let seq = 0;

/** A real agent with the recorder (K=4) in a temp run dir, and the engine in `mode`; `wrap` runs it under another command (unshare). */
async function run(mode: string, wrap: string[] = []) {
  const dir = tmpDir('wavebus-crashsig-');
  const runDir = path.join(dir, 'run');
  const root = path.join(dir, 'snapshots');
  const shm = `wbcrashsig-${process.pid}-${++seq}`;
  const identity = resolveIdentity({ RANK: '0', LOCAL_RANK: '0', WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '1' });
  const agent = new Agent({ identity, runDir, roots: { snapshots: root }, recorder: { forwards: 4, maxBytes: 4 * 4096 }, logger: pino({ level: 'silent' }) });
  await agent.start();
  const cmd = [...wrap, PYTHON, '-c', ENGINE, runDir, mode, shm];
  const engine = spawnTracked(cmd[0], cmd.slice(1), { env: ENV });
  const crashFile = path.join(root, 'recorder', `crash-${path.basename(runDir)}`, 'crash-rank0.json');
  const said = async () => {
    const line = await waitFor(() => engine.stdout().split('\n').find((l) => l.startsWith('{')), `the ${mode} engine's first line\n${engine.stderr()}`, 30000);
    return JSON.parse(line) as { pid: number; fault_file: string; recorded: number };
  };
  /** crash-rank0.json once the agent wrote it (written whole: atomic rename). */
  const crash = async () => JSON.parse(await waitFor(() => (fs.existsSync(crashFile) ? fs.readFileSync(crashFile, 'utf8') : undefined), `crash-rank0.json\n${engine.stderr().slice(-3000)}`, 15000));
  const done = async () => {
    engine.child.kill('SIGKILL');
    await engine.exited;
    await agent.stop();
    fs.rmSync(`/dev/shm/${shm}`, { force: true });
  };
  return { runDir, engine, crashFile, said, crash, done, agent };
}

test('a socket closed without goodbye while the engine lives on: crash-rank0.json says so, once', async () => {
  const r = await run('drop');
  try {
    const first = await r.said();
    expect(first).toMatchObject({ fault_file: 'enabled', recorded: 3 });
    const crash = await r.crash();
    expect(r.engine.child.exitCode).toBeNull(); // still alive: the connection was the only sign
    expect(crash).toMatchObject({
      engine_pid: first.pid, exit_code: null, signal: null, signal_from: null, fault_traceback: [],
      detected_by: `the connection closed without goodbye; pid ${first.pid} is still alive`,
      exit: 'none: the engine process is still alive; its connection closed without goodbye',
      last_forward: { forward: 3, compilation_hash: 'crashsig', global_step: 3 },
    });
    expect(crash.flushed.map((f: any) => f.forward)).toEqual([1, 2, 3]);
    expect(fs.statSync(r.crashFile).mode & 0o777).toBe(0o600);
    // Its death now (the pid watch's turn) is not a second crash.
    r.engine.child.kill('SIGKILL');
    await r.engine.exited;
    await new Promise((res) => setTimeout(res, 400));
    expect(r.agent.recorder!.flushes.filter((f) => f.reason === 'crash')).toHaveLength(1);
  } finally {
    await r.done();
  }
});

test("a SIGSEGV in the engine: crash-rank0.json names the signal and the engine's traceback down to the function", async () => {
  const r = await run('segv');
  try {
    const first = await r.said();
    expect(first.fault_file).toBe('enabled');
    const crash = await r.crash();
    expect((await r.engine.exited).signal).toBe('SIGSEGV');
    expect(crash).toMatchObject({ engine_pid: first.pid, signal: 'SIGSEGV', last_forward: { forward: 3 } });
    // From the zombie's status if the agent read it first, else from the engine's own words.
    expect(['proc', 'faulthandler']).toContain(crash.signal_from);
    expect(crash.exit).toMatch(/^killed by SIGSEGV/);
    expect(crash.fault_traceback.some((l: string) => / in crash_here$/.test(l))).toBe(true);
    expect(crash.fault_traceback.some((l: string) => /^Current thread /.test(l))).toBe(true);
    // The engine's file itself, as the client wrote it: 0600, and faulthandler's words for SIGSEGV.
    const faultFile = engineFaultPath(r.runDir, 0);
    expect(fs.lstatSync(faultFile).mode & 0o777).toBe(0o600);
    expect(readEngineFault(faultFile)).toMatchObject({ signal: 'SIGSEGV', said: 'Fatal Python error: Segmentation fault' });
  } finally {
    await r.done();
  }
});

test('a clean close is no crash, though the connection goes', async () => {
  const r = await run('clean');
  try {
    await r.said();
    await waitFor(() => r.engine.stdout().includes('closed'), 'the engine to close its client', 15000);
    expect((await r.engine.exited).code).toBe(0);
    await r.agent.stop(); // the pid watch's last look, and any connection grace decided
    expect(fs.existsSync(r.crashFile)).toBe(false);
    expect(r.agent.recorder!.flushes).toHaveLength(0);
  } finally {
    await r.done();
  }
});

describeAsRoot('an engine in another pid namespace (unshare needs root)', () => {
  test('it exits: its connection alone tells', async () => {
    const r = await run('exit', ['unshare', '--pid', '--fork', '--kill-child', '--mount-proc']);
    try {
      const first = await r.said();
      expect(first.pid).toBe(1); // its own namespace's init: the number means nothing to the agent
      const crash = await r.crash();
      expect(crash).toMatchObject({
        engine_pid: 1, exit_code: null, signal: null,
        detected_by: 'the connection closed without goodbye; pid 1 is not visible to this agent',
        exit: "unknown: the engine's pid is not visible to this agent (another pid namespace) and it left no word",
        last_forward: { forward: 3 },
      });
    } finally {
      await r.done();
    }
  });
});

test("the engine's fault file is read bounded, without following a link, and garbage in it is no signal", () => {
  const dir = tmpDir('wavebus-faultfile-');
  const file = path.join(dir, 'engine-fault-local0.txt');
  // Garbage, then no fatal line at all: nothing said.
  fs.writeFileSync(file, Buffer.from([0, 255, 10, 13, 0x1b, 0x5b, 50, 74]));
  expect(readEngineFault(file)).toBeUndefined();
  // 1 MiB of noise before the block, control bytes in it, 200 frames: the tail is read, 64 lines kept, printable only.
  const frames = Array.from({ length: 200 }, (_, i) => `  File "/x/eng\x07ine.py", line ${i} in f${i}`);
  fs.writeFileSync(file, `${'x'.repeat(2 ** 20)}\nFatal Python error: Bus error\n\nCurrent thread 0x1 (most recent call first):\n${frames.join('\n')}\n\nExtension modules: numpy (total: 1)\n`);
  const got = readEngineFault(file)!;
  expect(got.signal).toBe('SIGBUS');
  expect(got.traceback).toHaveLength(64);
  expect(got.traceback[1]).toBe('  File "/x/eng?ine.py", line 0 in f0');
  // Written before the engine's hello: a previous engine's words, not taken.
  expect(readEngineFault(file, Date.now() + 60000)).toBeUndefined();
  // An unknown fatal error: its words kept, no signal made up.
  fs.writeFileSync(file, 'Fatal Python error: _PyMem_DebugMalloc: something\n');
  expect(readEngineFault(file)).toMatchObject({ signal: null, said: 'Fatal Python error: _PyMem_DebugMalloc: something' });
  // A link where the file should be is not followed (it points at a real fault block).
  const real = path.join(dir, 'elsewhere.txt');
  fs.writeFileSync(real, 'Fatal Python error: Segmentation fault\n');
  fs.rmSync(file);
  fs.symlinkSync(real, file);
  expect(readEngineFault(real)?.signal).toBe('SIGSEGV');
  expect(readEngineFault(file)).toBeUndefined();
  // A fifo is refused without blocking.
  fs.rmSync(file);
  execFileSync('mkfifo', [file]);
  expect(readEngineFault(file)).toBeUndefined();
});
