// The launcher's child processes (coordinator, agents): each in its own process group, its output
// forwarded with a name prefix, stopped with SIGTERM then SIGKILL, and stopping itself when the
// launcher dies without tearing down.
import { ChildProcess, spawn } from 'child_process';

const TAIL_CHARS = 4000;

/**
 * Runs `node -e WATCHDOG -- bin/wavebus.js <args>`: the sidecar's stdin is a pipe from the
 * launcher, so if the launcher dies without tearing down (SIGKILL, OOM), the pipe's end makes
 * the sidecar stop itself (SIGTERM, then exit) instead of lingering and holding the bus ports.
 */
const WATCHDOG = [
  'const bin = process.argv[1];',
  'const stop = () => { process.kill(process.pid, "SIGTERM"); setTimeout(() => process.exit(1), 10000).unref(); };',
  'process.stdin.on("end", stop); process.stdin.on("error", stop); process.stdin.resume();',
  'require(bin);',
].join(' ');

/** A coordinator or agent process: its own process group, output forwarded with a prefix. */
export class Sidecar {
  readonly child: ChildProcess;
  private tail = '';
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(
    readonly name: string,
    bin: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    /** Flags for node itself (the coordinator's COORDINATOR_NODE_FLAGS). */
    nodeFlags: readonly string[] = [],
    /** Written to the child's descriptor 3 (a pipe, then closed): the bus token, from the launcher's memory. */
    secret?: string,
  ) {
    // Own process group: a Ctrl-C on the terminal reaches the command, not the sidecars, which
    // must outlive the command's shutdown; we stop them after it exits.
    this.child = spawn(process.execPath, [...nodeFlags, '-e', WATCHDOG, '--', bin, ...args], { detached: true, stdio: secret === undefined ? ['pipe', 'pipe', 'pipe'] : ['pipe', 'pipe', 'pipe', 'pipe'], env });
    this.child.stdin?.on('error', () => undefined); // EPIPE once it has exited
    if (secret !== undefined) {
      const pipe = this.child.stdio[3] as NodeJS.WritableStream & { on(e: 'error', f: () => void): void };
      pipe.on('error', () => undefined);
      pipe.end(secret);
    }
    const forward = (b: Buffer) => {
      const s = b.toString();
      this.tail = (this.tail + s).slice(-TAIL_CHARS);
      for (const line of s.split('\n')) if (line !== '') process.stderr.write(`[${this.name}] ${line}\n`);
    };
    this.child.stdout?.on('data', forward);
    this.child.stderr?.on('data', forward);
    this.exited = new Promise((resolve) => {
      this.child.on('error', (e) => {
        this.tail += `\n${e.message}`;
        // Spawn itself failed: there will be no 'exit' event.
        if (this.child.pid === undefined && this.exit === undefined) {
          this.exit = { code: null, signal: null };
          resolve(this.exit);
        }
      });
      this.child.on('exit', (code, signal) => {
        this.exit = { code, signal };
        resolve(this.exit);
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  alive(): boolean {
    return this.exit === undefined && this.child.pid !== undefined;
  }

  stderrTail(): string {
    return this.tail.trim().split('\n').slice(-20).join('\n');
  }

  exitDescription(): string {
    const e = this.exit;
    if (!e) return 'is running';
    if (e.code === null && e.signal === null) return 'could not be started';
    return e.signal ? `was killed by ${e.signal}` : `exited with code ${e.code}`;
  }

  signalGroup(sig: NodeJS.Signals): void {
    if (this.child.pid === undefined) return;
    try {
      process.kill(-this.child.pid, sig);
    } catch {
      /* group already gone */
    }
  }

  /** SIGTERM, then SIGKILL after `graceMs`; also kills anything left in its process group. */
  async stop(graceMs: number): Promise<void> {
    if (this.alive()) {
      this.signalGroup('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const killed = new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          this.signalGroup('SIGKILL');
          resolve();
        }, graceMs);
      });
      await Promise.race([this.exited, killed]);
      clearTimeout(timer);
      await this.exited;
    }
    this.signalGroup('SIGKILL');
  }
}
