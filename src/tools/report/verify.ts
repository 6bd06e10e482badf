// The Verification section and the banner at the top: `inspect --verify`'s checks, run as the
// page is made, every failure in red with its reason.
import type { ReportTree } from './collect';
import { esc } from './html';

export interface Verification {
  failures: string[];
  checkedFiles: number;
  bundles: number;
}

export function verification(tree: ReportTree): Verification {
  const failures = [
    ...tree.inspect.problems,
    ...tree.inspect.incomplete.map((p) => `${p}: left by an interrupted writer (temporary name)`),
    ...tree.unreadable,
  ];
  const checkedFiles = tree.inspect.bundles.reduce((n, b) => n + b.files.filter((f) => f.verified !== undefined).length, 0);
  return { failures, checkedFiles, bundles: tree.inspect.bundles.length };
}

export function banner(v: Verification): string {
  return v.failures.length
    ? `<div class="banner bad" id="verify-banner">Verification FAILED: ${v.failures.length} problem(s); see <a href="#verification">Verification</a>.</div>`
    : `<div class="banner ok" id="verify-banner">Verified: ${v.bundles} bundle(s), ${v.checkedFiles} file checksum(s), no problems.</div>`;
}

export function verificationSection(v: Verification): string {
  const list = v.failures.length ? `<ul id="verify-failures">${v.failures.map((f) => `<li class="fail">${esc(f)}</li>`).join('')}</ul>` : '<p class="okc" id="verify-ok">Every listed file is present with its recorded size and checksum, nothing unlisted lies beside them, and every expected rank is present.</p>';
  return `<section id="verification"><h2>Verification</h2>
<p>The checks of <code>wavebus inspect DIR --verify</code>, run while this page was made: ${v.bundles} bundle(s), ${v.checkedFiles} checksum(s) recomputed.</p>
${list}</section>`;
}
