// JSONC (JSON with // and /* */ comments and trailing commas), as runtime_config.json allows.
// Comments and trailing commas are blanked in place (same length, newlines kept) so that every
// offset in the stripped text is the offset in the original: error positions need no mapping.
// The stripped text is then parsed by a small strict JSON parser that knows where it failed
// (JSON.parse in Node 20 does not always say where).
import { JsoncError } from '../errors';

/** Blank comments (outside strings) and commas that directly precede `}` or `]`. Same length. */
export function stripJsonc(text: string): string {
  const out = text.split('');
  let i = 0;
  const n = text.length;
  let lastComma = -1; // index of a comma not yet followed by anything but blanks/comments
  while (i < n) {
    const c = text[i];
    if (c === '"') {
      lastComma = -1;
      i++;
      while (i < n && text[i] !== '"') {
        if (text[i] === '\\') i++;
        if (text[i] === '\n') break; // unterminated: let the parser report it
        i++;
      }
      i++;
      continue;
    }
    if (c === '/' && text[i + 1] === '/') {
      while (i < n && text[i] !== '\n') out[i++] = ' ';
      continue;
    }
    if (c === '/' && text[i + 1] === '*') {
      const end = text.indexOf('*/', i + 2);
      const stop = end < 0 ? n : end + 2; // unterminated block comment runs to the end
      for (; i < stop; i++) if (text[i] !== '\n' && text[i] !== '\r') out[i] = ' ';
      continue;
    }
    if (c === ',') {
      lastComma = i;
    } else if (c === '}' || c === ']') {
      if (lastComma >= 0) out[lastComma] = ' ';
      lastComma = -1;
    } else if (c !== ' ' && c !== '\t' && c !== '\n' && c !== '\r') {
      lastComma = -1;
    }
    i++;
  }
  return out.join('');
}

/** 1-based line and column of `offset` in `text`. */
export function lineColumn(text: string, offset: number): { line: number; column: number } {
  let line = 1;
  let lineStart = 0;
  const stop = Math.min(offset, text.length);
  for (let i = 0; i < stop; i++) {
    if (text[i] === '\n') {
      line++;
      lineStart = i + 1;
    }
  }
  return { line, column: stop - lineStart + 1 };
}

class Fail {
  constructor(readonly offset: number, readonly reason: string) {}
}

/**
 * Deepest nesting of objects and arrays accepted. The parser recurses once per level; a config
 * is a few levels deep, and an unbounded depth would end in V8's "Maximum call stack size
 * exceeded" with no position.
 */
export const MAX_JSONC_DEPTH = 64;

const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

/** Strict JSON over `text` (already stripped); throws Fail with the offset of the problem. */
function parseStrict(text: string): unknown {
  let i = 0;
  let depth = 0;
  const enter = () => {
    if (++depth > MAX_JSONC_DEPTH) throw new Fail(i, `nesting deeper than ${MAX_JSONC_DEPTH} levels (MAX_JSONC_DEPTH)`);
  };
  const ws = () => {
    while (i < text.length) {
      const c = text.charCodeAt(i);
      if (c === 32 || c === 9 || c === 10 || c === 13) i++;
      else break;
    }
  };
  const describe = (at: number) => (at >= text.length ? 'Unexpected end of input' : `Unexpected token ${JSON.stringify(text[at])}`);
  const value = (): unknown => {
    ws();
    const c = text[i];
    if (c === '{') return object();
    if (c === '[') return array();
    if (c === '"') return string();
    if (c === 't' && text.startsWith('true', i)) return (i += 4), true;
    if (c === 'f' && text.startsWith('false', i)) return (i += 5), false;
    if (c === 'n' && text.startsWith('null', i)) return (i += 4), null;
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m && m[0].length > 0 && m[0] !== '-') {
      i += m[0].length;
      return Number(m[0]);
    }
    throw new Fail(i, describe(i));
  };
  const string = (): string => {
    const start = i;
    i++;
    while (i < text.length && text[i] !== '"') {
      const code = text.charCodeAt(i);
      if (code < 0x20) throw new Fail(i, 'Bad control character in string literal');
      if (text[i] === '\\') i++;
      i++;
    }
    if (i >= text.length) throw new Fail(start, 'Unterminated string');
    i++;
    try {
      return JSON.parse(text.slice(start, i)) as string;
    } catch {
      throw new Fail(start, 'Bad escape in string literal');
    }
  };
  const array = (): unknown[] => {
    const out: unknown[] = [];
    enter();
    i++;
    ws();
    if (text[i] === ']') return i++, depth--, out;
    for (;;) {
      out.push(value());
      ws();
      if (text[i] === ',') {
        i++;
        continue;
      }
      if (text[i] === ']') return i++, depth--, out;
      throw new Fail(i, `${describe(i)}, expected ',' or ']'`);
    }
  };
  const object = (): Record<string, unknown> => {
    // Null prototype: a key named __proto__ is just a key (and then an unknown one).
    const out = Object.create(null) as Record<string, unknown>;
    enter();
    i++;
    ws();
    if (text[i] === '}') return i++, depth--, out;
    for (;;) {
      ws();
      if (text[i] !== '"') throw new Fail(i, `${describe(i)}, expected a property name in double quotes`);
      const key = string();
      ws();
      if (text[i] !== ':') throw new Fail(i, `${describe(i)}, expected ':'`);
      i++;
      out[key] = value();
      ws();
      if (text[i] === ',') {
        i++;
        continue;
      }
      if (text[i] === '}') return i++, depth--, out;
      throw new Fail(i, `${describe(i)}, expected ',' or '}'`);
    }
  };
  const v = value();
  ws();
  if (i < text.length) throw new Fail(i, `${describe(i)} after the end of the JSON value`);
  return v;
}

/** Parse a JSONC document whose root must be an object. `source` names it in errors (a file path). */
export function parseJsonc(text: string, source: string): Record<string, unknown> {
  const body = text.charCodeAt(0) === 0xfeff ? ' ' + text.slice(1) : text; // BOM: keep offsets
  const stripped = stripJsonc(body);
  let v: unknown;
  try {
    v = parseStrict(stripped);
  } catch (e) {
    if (!(e instanceof Fail)) throw e;
    const { line, column } = lineColumn(body, e.offset);
    throw new JsoncError(source, line, column, e.reason);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    const { line, column } = lineColumn(body, stripped.search(/\S/) < 0 ? 0 : stripped.search(/\S/));
    throw new JsoncError(source, line, column, `the root must be a JSON object, got ${v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v}`);
  }
  return v as Record<string, unknown>;
}
