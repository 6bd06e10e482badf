// JSON files of artifact trees (incident reports, dump.json, meta.json, manifests, timelines,
// bisect results): the tree may come from anywhere. One reader for all of them: no link followed,
// a size cap read from fstat, and a nesting limit checked on the text before JSON.parse. V8 parses
// deep JSON fine, but whatever walks the value afterwards (JSON.stringify, a table of its fields)
// recurses: one 5000-deep report took `wavebus report` down with "Maximum call stack size
// exceeded". Refused here, the file costs its own section only, under its name and this reason.
import * as fs from 'fs';

/** Reports and records are a few KiB; a timeline is at most a few MiB. */
export const MAX_ARTIFACT_JSON_BYTES = 16 << 20;
/** wavebus writes files a few levels deep (a report's detail, a timeline's rows): far below this. */
export const MAX_ARTIFACT_JSON_DEPTH = 64;

/** Where `text` nests deeper than `max` arrays and objects (outside strings), or -1. */
export function jsonTooDeepAt(text: string, max = MAX_ARTIFACT_JSON_DEPTH): number {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return i;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return -1;
}

/** JSON.parse, refusing text nested deeper than `maxDepth` (the message gives the offset). */
export function parseArtifactJson(text: string, maxDepth = MAX_ARTIFACT_JSON_DEPTH): unknown {
  const at = jsonTooDeepAt(text, maxDepth);
  if (at >= 0) throw new Error(`nested deeper than ${maxDepth} arrays and objects (at byte offset ${at}); not read`);
  return JSON.parse(text);
}

/** Read and parse a JSON file of an artifact tree: a regular file (no link), capped, depth-limited. */
export function readArtifactJson(file: string, maxBytes = MAX_ARTIFACT_JSON_BYTES, maxDepth = MAX_ARTIFACT_JSON_DEPTH): unknown {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new Error('not a regular file');
    if (st.size > maxBytes) throw new Error(`${st.size} bytes, over the ${maxBytes}-byte cap`);
    return parseArtifactJson(fs.readFileSync(fd, 'utf8'), maxDepth);
  } finally {
    fs.closeSync(fd);
  }
}
