// What the verdict tests (verdict.test.ts, verdict-netns.test.ts) set up for their "hosts": each
// host's folder, the device-fault file the bad-device test double reads
// (examples/torch-engine/device_fault.py), the environment file `--host-env` gives a replay on that
// host; and the verdict.json files written beside recorder flushes.
import * as fs from 'fs';
import * as path from 'path';

export interface VerdictHost {
  name: string;
  /** <dir>/<name>: the host's own folder. */
  dir: string;
  /** <dir>/<name>/device-fault.json: absent unless the test makes this host's device bad. */
  fault: string;
  /** <dir>/<name>.env: what a process on this host sees (`--host-env <name>=<envFile>`). */
  envFile: string;
}

/** Each named host's folder and environment file under `dir`. */
export function makeVerdictHosts(dir: string, names: readonly string[]): VerdictHost[] {
  return names.map((name) => {
    const h = { name, dir: path.join(dir, name), fault: path.join(dir, name, 'device-fault.json'), envFile: path.join(dir, `${name}.env`) };
    fs.mkdirSync(h.dir);
    fs.writeFileSync(h.envFile, `# what a process on ${name} sees\nTORCH_ENGINE_DEVICE_FAULT_FILE=${h.fault}\n`);
    return h;
  });
}

/** Every verdict.json beside a recorder flush under `root`. */
export function flushVerdicts(root: string): string[] {
  const out: string[] = [];
  const walk = (d: string, depth: number) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory() && depth < 6) walk(p, depth + 1);
      else if (e.name === 'verdict.json' && path.basename(path.dirname(path.dirname(p))) === 'recorder') out.push(p);
    }
  };
  if (fs.existsSync(root)) walk(root, 0);
  return out.sort();
}
