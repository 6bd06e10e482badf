// Where input snapshots go: the wavebus root, or the seed's root when the seed's variables switch
// capture on (docs/snapshots.md, "Where snapshots go").
import * as os from 'os';
import * as path from 'path';
import { ConfigError } from '../errors';
import type { SnapshotFlags } from './config';
import { checkPathLength } from '../paths';

/** `~` and `~/x` as Python's os.path.expanduser reads them (HOME first), then absolute. */
function expandUser(p: string, env: NodeJS.ProcessEnv): string {
  const home = env.HOME && env.HOME !== '' ? env.HOME : os.homedir();
  const e = p === '~' ? home : p.startsWith('~/') ? path.join(home, p.slice(2)) : p;
  return path.resolve(e);
}

/**
 * A root variable that is set must name a directory while capture is on: vLLM would read "" as
 * the working directory. With capture off nothing is written there, so a blank one counts as unset.
 */
function rootVar(env: NodeJS.ProcessEnv, name: string, strict: boolean): string | undefined {
  const v = env[name];
  if (v === undefined) return undefined;
  if (v.trim() === '') {
    if (!strict) return undefined;
    throw new ConfigError(`${name}=${JSON.stringify(v)} is blank; set it to a directory or unset it`, 'ERR_SNAPSHOT_ROOT');
  }
  return v;
}

/**
 * Where call dirs go, in this order:
 *  1. the --cache-root flag: `<flag>/snapshots`;
 *  2. WAVEBUS_CACHE_ROOT, when set: `$WAVEBUS_CACHE_ROOT/snapshots` (an explicit wavebus root);
 *  3. capture switched on by the seed's name (VLLM_NEURON_RUNTIME_INPUT_SNAPSHOT_ENABLE, not
 *     WAVEBUS_SNAPSHOT_ENABLE nor a flag): the seed's root `$VLLM_CACHE_ROOT/neuron/snapshots`, with
 *     vLLM's default for VLLM_CACHE_ROOT (`$XDG_CACHE_HOME/vllm`, else `~/.cache/vllm`, expanded);
 *  4. `~/.cache/wavebus/snapshots`.
 * `captureOn` false (capture off): a blank variable is skipped, as if unset, instead of refused.
 * A root the kernel cannot open (a component over 255 bytes, the whole over 4095) is refused naming
 * the flag or variable it came from, capture on or off (a live capture may turn it on later).
 */
export function resolveSnapshotRoot(
  env: NodeJS.ProcessEnv,
  flags: Partial<SnapshotFlags>,
  enabledBySeed: boolean,
  captureOn: boolean,
): { root: string; source: string } {
  const r = pickSnapshotRoot(env, flags, enabledBySeed, captureOn);
  checkPathLength(r.root, r.from, 'ERR_SNAPSHOT_ROOT');
  return { root: r.root, source: r.source };
}

function pickSnapshotRoot(env: NodeJS.ProcessEnv, flags: Partial<SnapshotFlags>, enabledBySeed: boolean, captureOn: boolean): { root: string; source: string; from: string } {
  if (flags.cacheRoot !== undefined && flags.cacheRoot !== '') return { root: path.join(path.resolve(flags.cacheRoot), 'snapshots'), source: '--cache-root', from: '--cache-root' };
  const ours = rootVar(env, 'WAVEBUS_CACHE_ROOT', captureOn);
  if (ours !== undefined) return { root: path.join(expandUser(ours, env), 'snapshots'), source: 'WAVEBUS_CACHE_ROOT', from: 'WAVEBUS_CACHE_ROOT' };
  if (enabledBySeed) {
    const vllm = rootVar(env, 'VLLM_CACHE_ROOT', captureOn);
    if (vllm !== undefined) return { root: path.join(expandUser(vllm, env), 'neuron', 'snapshots'), source: 'VLLM_CACHE_ROOT', from: 'VLLM_CACHE_ROOT' };
    // vLLM: os.getenv("XDG_CACHE_HOME", "~/.cache") + "/vllm", expanded.
    const xdg = rootVar(env, 'XDG_CACHE_HOME', captureOn);
    const base = xdg !== undefined ? xdg : '~/.cache';
    return { root: path.join(expandUser(path.join(base, 'vllm'), env), 'neuron', 'snapshots'), source: xdg !== undefined ? 'XDG_CACHE_HOME (vLLM default for VLLM_CACHE_ROOT)' : "vLLM's default VLLM_CACHE_ROOT (~/.cache/vllm)", from: xdg !== undefined ? 'XDG_CACHE_HOME' : 'HOME' };
  }
  return { root: path.join(expandUser('~/.cache/wavebus', env), 'snapshots'), source: 'default (~/.cache/wavebus)', from: 'HOME' };
}

