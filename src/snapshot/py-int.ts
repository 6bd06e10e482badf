// Integers in snapshot variables are read the way upstream reads them, with Python's str.strip()
// and int(): surrounding blanks, an optional sign, decimal digits (any script's), single
// underscores between digits. `-0` is 0, ` +3 ` is 3, `1_0` is 10; `1__0`, `_1`, `0x1`, `1e3`,
// `1.5` are refused, as int() refuses them. One reader for every snapshot variable.

/** Characters str.isspace() is true for: what str.strip() removes around a piece. */
const PY_SPACE = new Set([
  '\t', '\n', '\v', '\f', '\r', '\x1c', '\x1d', '\x1e', '\x1f', ' ', '\x85', '\xa0', '\u1680',
  '\u2000', '\u2001', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200a',
  '\u2028', '\u2029', '\u202f', '\u205f', '\u3000',
]);

/** int() itself skips only ASCII blanks, and non-ASCII ones (it maps those to ' ' first): not \x1c..\x1f. */
function intSpace(ch: string): boolean {
  return ch === ' ' || (ch >= '\t' && ch <= '\r') || (ch > '\x7f' && PY_SPACE.has(ch));
}

/** Python's str.strip() with no argument. */
export function pyStrip(s: string): string {
  const chars = [...s];
  let a = 0;
  let b = chars.length;
  while (a < b && PY_SPACE.has(chars[a])) a++;
  while (b > a && PY_SPACE.has(chars[b - 1])) b--;
  return chars.slice(a, b).join('');
}

const ND = /^\p{Nd}$/u;

/**
 * The value of one decimal digit of any script, as int() reads it. Unicode assigns decimal digits
 * only in runs of ten, 0 through 9, so a digit's value is its distance from the start of its run.
 */
function digitValue(ch: string): number | null {
  if (ch >= '0' && ch <= '9') return ch.charCodeAt(0) - 48;
  if (!ND.test(ch)) return null;
  const cp = ch.codePointAt(0)!;
  let start = cp;
  while (start > 0 && ND.test(String.fromCodePoint(start - 1))) start--;
  return (cp - start) % 10;
}

export type PyIntResult = { ok: true; value: number } | { ok: false; why: string };

/** int(text) in base 10, limited to safe JavaScript integers; -0 comes back as 0. */
export function pyInt(text: string): PyIntResult {
  const chars = [...text];
  let a = 0;
  let b = chars.length;
  while (a < b && intSpace(chars[a])) a++;
  while (b > a && intSpace(chars[b - 1])) b--;
  let sign = 1;
  if (a < b && (chars[a] === '+' || chars[a] === '-')) {
    if (chars[a] === '-') sign = -1;
    a++;
  }
  if (a >= b) return { ok: false, why: 'not a decimal integer' };
  let digits = '';
  let lastWasDigit = false;
  for (let i = a; i < b; i++) {
    const ch = chars[i];
    if (ch === '_') {
      // int(): an underscore only between two digits.
      if (!lastWasDigit || i + 1 >= b) return { ok: false, why: 'not a decimal integer (an underscore goes only between digits)' };
      lastWasDigit = false;
      continue;
    }
    const d = digitValue(ch);
    if (d === null) return { ok: false, why: 'not a decimal integer' };
    digits += String(d);
    lastWasDigit = true;
  }
  if (!lastWasDigit) return { ok: false, why: 'not a decimal integer' };
  const n = Number(digits);
  if (!Number.isSafeInteger(n)) return { ok: false, why: 'integer out of range' };
  return { ok: true, value: n === 0 ? 0 : sign * n };
}
