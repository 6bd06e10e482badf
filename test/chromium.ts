// Real headless Chromium (Debian's `chromium`) for tests of HTML pages: the DOM after the page's
// scripts ran, its console messages (errors included), a screenshot. Each run has its own profile
// dir and process group; both are gone when the call returns.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

export const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));

export interface ChromiumRun {
  dom: string;
  /** Console lines ("CONSOLE" in Chromium's log): console.* calls, uncaught errors, CSP violations. */
  console: string[];
}

async function runChromium(args: string[], timeoutMs: number): Promise<{ stdout: string; stderr: string; code: number | null }> {
  if (!CHROMIUM) throw new Error('chromium is not installed');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'wavebus-chromium-'));
  const child = spawn(CHROMIUM, ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-extensions', `--user-data-dir=${profile}`, ...args], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (b) => (stdout += b.toString()));
  child.stderr!.on('data', (b) => (stderr += b.toString()));
  const timer = setTimeout(() => killGroup(child.pid!), timeoutMs);
  const code = await new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
  clearTimeout(timer);
  // Its helpers (zygote, renderer, crashpad) share the group: none outlives the call.
  killGroup(child.pid!);
  fs.rmSync(profile, { recursive: true, force: true });
  return { stdout, stderr, code };
}

function killGroup(pid: number): void {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    /* gone */
  }
}

/** Load `file` and return the DOM after its scripts ran, and its console lines. */
export async function loadPage(file: string, timeoutMs = 60000): Promise<ChromiumRun> {
  const r = await runChromium(['--enable-logging=stderr', '--v=0', '--dump-dom', `file://${path.resolve(file)}`], timeoutMs);
  if (!r.stdout.includes('</html>')) throw new Error(`chromium printed no DOM (exit ${r.code}): ${r.stderr.slice(-2000)}`);
  return { dom: r.stdout, console: r.stderr.split('\n').filter((l) => l.includes(':CONSOLE')) };
}

/** A PNG screenshot of `file` at width × height. */
export async function screenshot(file: string, png: string, width = 1280, height = 1800, timeoutMs = 60000): Promise<void> {
  fs.rmSync(png, { force: true });
  const r = await runChromium([`--window-size=${width},${height}`, '--hide-scrollbars', `--screenshot=${path.resolve(png)}`, `file://${path.resolve(file)}`], timeoutMs);
  if (!fs.existsSync(png)) throw new Error(`chromium wrote no screenshot (exit ${r.code}): ${r.stderr.slice(-2000)}`);
}

/** How many times `needle` occurs in `text`. */
export const count = (text: string, needle: string | RegExp): number => (typeof needle === 'string' ? text.split(needle).length - 1 : (text.match(new RegExp(needle.source, 'g')) ?? []).length);
