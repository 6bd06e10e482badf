// Untrusted strings (request ids, incident types, layer names) become single safe path components.
//
// Rules (docs/formats.md): '%' starts an escape, so the mapping is injective: '%', '/', '\', NUL,
// control characters and DEL become %XX; a leading '.' becomes %2E (no hidden files, no '.'/'..',
// no clash with bundle temp names); lone UTF-16 surrogates become %uXXXX; other Unicode is kept.
// The empty string becomes "%empty". Names longer than MAX_COMPONENT_BYTES (UTF-8) are cut at a
// character boundary and get "~" + 16 hex digits of sha256(original), so distinct ids stay distinct.
//
// Escape once: an untrusted name is escaped where it becomes a path (the dump executor for layer
// names, the guard for request ids and incident types). Writers below that (the bundle writer)
// check with isSafeComponent that a name is already safe and never escape it again: safeComponent
// is not idempotent ('%' becomes '%25'), and must not be, or it would not be injective.
import * as crypto from 'crypto';
import * as path from 'path';
import { CaptureError } from '../errors';

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

/** NAME_MAX: a name built from a safe component plus suffixes (".k.npy") may use all of it. */
export const MAX_NAME_BYTES = 255;

/** One escape: %XX (two upper-case hex digits), %uXXXX (a lone surrogate), or %empty at the start. */
const ESCAPE_RE = /%(?:[0-9A-F]{2}|u[0-9A-F]{4})/y;

/**
 * Whether `name` is one path component as safeComponent writes them, possibly followed by plain
 * suffixes such as ".k.npy": non-empty, at most MAX_NAME_BYTES (UTF-8), no leading '.', no '/',
 * '\\', NUL, control character, DEL or lone surrogate, and every '%' the start of a whole escape.
 */
export function isSafeComponent(name: unknown): boolean {
  if (typeof name !== 'string' || name.length === 0 || name.startsWith('.')) return false;
  if (Buffer.byteLength(name, 'utf8') > MAX_NAME_BYTES) return false;
  for (let i = 0; i < name.length; i++) {
    const c = name.charCodeAt(i);
    if (c < 0x20 || c === 0x7f || c === 0x2f || c === 0x5c) return false;
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = i + 1 < name.length ? name.charCodeAt(i + 1) : 0;
      if (d < 0xdc00 || d > 0xdfff) return false;
      i++;
      continue;
    }
    if (c >= 0xdc00 && c <= 0xdfff) return false;
    if (c === 0x25 /* % */) {
      if (i === 0 && name.startsWith('%empty')) {
        i += 5;
        continue;
      }
      ESCAPE_RE.lastIndex = i;
      const m = ESCAPE_RE.exec(name);
      if (!m) return false;
      i += m[0].length - 1;
    }
  }
  return true;
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
