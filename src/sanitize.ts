// Untrusted strings (request ids, incident types, layer names) become single safe path components.
//
// Rules (docs/formats.md): '%' starts an escape, so the mapping is injective: '%', '/', '\', NUL,
// control characters and DEL become %XX; a leading '.' becomes %2E (no hidden files, no '.'/'..',
// no clash with bundle temp names); lone UTF-16 surrogates become %uXXXX; other Unicode is kept.
// The empty string becomes "%empty". Names longer than MAX_COMPONENT_BYTES (UTF-8) are cut at a
// character boundary and get "~" + 16 hex digits of sha256(original), so distinct ids stay distinct.
import * as crypto from 'crypto';
import * as path from 'path';
import { CaptureError } from './errors';

/** Room below NAME_MAX (255) for temp-name and extension suffixes. */
export const MAX_COMPONENT_BYTES = 160;

function hex2(n: number): string {
  return `%${n.toString(16).toUpperCase().padStart(2, '0')}`;
}

/** Map an untrusted string to one safe path component; `what` names it in errors. */
export function safeComponent(untrusted: string, what: string): string {
  if (typeof untrusted !== 'string') {
    throw new CaptureError(`${what}: expected a string for a path component, got ${untrusted === null ? 'null' : typeof untrusted}`, 'ERR_UNSAFE_NAME');
  }
  if (untrusted.length === 0) return '%empty';
  let out = '';
  for (let i = 0; i < untrusted.length; i++) {
    const c = untrusted.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < untrusted.length) {
      const d = untrusted.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        out += untrusted[i] + untrusted[i + 1]; // a valid surrogate pair: keep the character
        i++;
        continue;
      }
    }
    if (c >= 0xd800 && c <= 0xdfff) out += `%u${c.toString(16).toUpperCase()}`;
    else if (c < 0x20 || c === 0x7f || c === 0x25 /* % */ || c === 0x2f /* / */ || c === 0x5c /* \ */) out += hex2(c);
    else if (c === 0x2e /* . */ && i === 0) out += '%2E';
    else out += untrusted[i];
  }
  if (Buffer.byteLength(out, 'utf8') > MAX_COMPONENT_BYTES) {
    const suffix = `~${crypto.createHash('sha256').update(untrusted, 'utf8').digest('hex').slice(0, 16)}`;
    const budget = MAX_COMPONENT_BYTES - suffix.length;
    let cut = '';
    let bytes = 0;
    for (const ch of out) {
      const n = Buffer.byteLength(ch, 'utf8');
      if (bytes + n > budget) break;
      cut += ch;
      bytes += n;
    }
    // Do not end on a partial escape ("%2" or "%u"): drop it so the cut stays decodable.
    cut = cut.replace(/%(u[0-9A-F]{0,3}|[0-9A-F]?)$/, '');
    out = cut + suffix;
  }
  return out;
}

/** Resolve `components` under `root` and assert the result stays inside root. */
export function joinUnder(root: string, ...components: string[]): string {
  const base = path.resolve(root);
  for (const [i, c] of components.entries()) {
    if (typeof c !== 'string' || c.includes('\0')) throw new CaptureError(`path component ${i} under ${base} is not a valid string`, 'ERR_UNSAFE_PATH');
  }
  const full = path.resolve(base, ...components);
  const rel = path.relative(base, full);
  if (rel.startsWith('..') || path.isAbsolute(rel) || (components.length > 0 && rel === '')) {
    throw new CaptureError(`path ${JSON.stringify(components.join('/'))} escapes ${base} (resolves to ${full})`, 'ERR_UNSAFE_PATH');
  }
  return full;
}
