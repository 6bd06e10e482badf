// The body kinds the fuzz model knows, from proto/wavebus.proto itself (src/proto.ts): a body kind
// added to the proto and not to the model, or to a corpus, stops the bench at start with its name,
// instead of the fuzz silently never sending it or mispredicting it.
import { messageType } from '../../src/proto';

/** The members of `typeName`'s oneof (names as decoded messages carry them in `.body`, camelCase). */
export function oneofMembers(typeName: string, oneof = 'body'): string[] {
  const o = messageType(typeName).oneofs?.[oneof];
  if (!o) throw new Error(`fuzz model: proto message ${typeName} has no oneof ${oneof}`);
  return o.fieldsArray.map((f) => f.name);
}

/**
 * A table of per-kind expectations that must name every member of the oneof, and nothing else:
 * throws naming the missing (or unknown) members.
 */
export function perKind<T>(typeName: string, oneof: string, table: Record<string, T>, what: string): Record<string, T> {
  const members = oneofMembers(typeName, oneof);
  const missing = members.filter((k) => !Object.prototype.hasOwnProperty.call(table, k));
  const unknown = Object.keys(table).filter((k) => !members.includes(k));
  if (missing.length > 0 || unknown.length > 0) {
    throw new Error(
      `fuzz model: ${what} must list every ${typeName}.${oneof} member of proto/wavebus.proto` +
        `${missing.length > 0 ? `; missing ${missing.join(', ')}` : ''}${unknown.length > 0 ? `; not in the proto: ${unknown.join(', ')}` : ''}`,
    );
  }
  return table;
}

/** Throws unless the valid corpus `what` carries every member of the oneof (`kinds`: the members it carries). */
export function coversOneof(typeName: string, oneof: string, kinds: Iterable<string | undefined>, what: string): void {
  const have = new Set(kinds);
  const missing = oneofMembers(typeName, oneof).filter((k) => !have.has(k));
  if (missing.length > 0) throw new Error(`fuzz model: the ${what} corpus has no valid ${typeName}.${oneof} of kind ${missing.join(', ')} (proto/wavebus.proto)`);
}
