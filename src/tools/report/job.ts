// The Job section: layout and hosts, versions, the config in force, fingerprint differences.
import * as fs from 'fs';
import * as path from 'path';
import { packageRoot } from '../../paths';
import type { ReportTree } from './collect';
import { esc, jsonCell, kvTable } from './html';
import { recorderFlushes } from './recorder-section';

function wavebusVersion(): string {
  try {
    return String(JSON.parse(fs.readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')).version);
  } catch {
    return 'unknown';
  }
}

/** Hosts and their ranks, from the ranks' timelines (each names its host). */
function hostsOf(tree: ReportTree): Map<string, number[]> {
  const hosts = new Map<string, number[]>();
  for (const t of tree.timelines) {
    const h = t.host ?? '(unknown)';
    hosts.set(h, [...(hosts.get(h) ?? []), t.rank]);
  }
  return hosts;
}

/** A path under the current directory relative to it (the page then shows what the user typed). */
function shownPath(p: string): string {
  const r = path.relative(process.cwd(), p);
  return r === '' ? '.' : r.startsWith('..') || path.isAbsolute(r) ? p : r;
}

/** Ranks as short ranges: 0-3,8,10-11. */
export function rankRanges(ranks: number[]): string {
  const s = [...new Set(ranks)].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < s.length; ) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j] + 1) j++;
    out.push(j === i ? `${s[i]}` : `${s[i]}-${s[j]}`);
    i = j + 1;
  }
  return out.join(',');
}

export function jobSection(tree: ReportTree, pageDir: string = process.cwd()): string {
  const l = tree.layout;
  const hosts = hostsOf(tree);
  const facts: Record<string, unknown> = {
    tree: shownPath(tree.root),
    layout: l ? `DP ${l.dp} × PP ${l.pp} × TP ${l.tp}${l.cp > 1 ? ` × CP ${l.cp}` : ''} = ${l.worldSize} ranks` : 'not recorded (no dump record in the tree names one)',
    hosts: hosts.size ? [...hosts].map(([h, r]) => `${h}: ranks ${rankRanges(r)}`).join('; ') : 'not recorded (no rank timeline in the tree)',
    incidents: tree.incidents.length,
    'KV dumps': tree.inspect.bundles.filter((b) => b.kind === 'dump_wave').length,
    'input snapshots': tree.inspect.bundles.filter((b) => b.kind === 'snapshot' && !b.dir.split('/').includes('recorder')).length,
    'recorder flushes': tree.recorderFlushes.length + tree.recorderFlushesLeftOut,
  };
  const versions: Record<string, unknown> = {
    'wavebus (this page)': wavebusVersion(),
    node: process.version,
    'report format': 'page made by `wavebus report`',
  };
  const configs = tree.configs.length
    ? tree.configs.map((c) => `<h3>Config in force: <code>${esc(c.file)}</code></h3><details><summary>runtime_config.json</summary>${jsonCell(JSON.stringify(c.value, null, 2))}</details>`).join('')
    : '<p>No <code>config/runtime_config.json</code> in the tree.</p>';
  return `<section id="job"><h2>Job</h2>
${kvTable(facts)}
<h3>Versions</h3>${kvTable(versions)}
${configs}
<h3>Fingerprint differences</h3><p id="fingerprints">none recorded (this job's ranks record no fingerprints)</p>
<h3>Recorder flushes</h3>${recorderFlushes(tree, pageDir)}
</section>`;
}
