// Token text for the report's token stream: a byte vocabulary (a JSON list, id → token string, or
// an object {"id": "token"}) or a Hugging Face tokenizer.json (model.vocab: token → id).
import { ConfigError } from '../../errors';
import { readJsonFile } from './collect';

export interface Vocabulary {
  source: string;
  text(id: number): string;
}

/** Reads FILE; throws naming the file and what it expected. */
export function loadVocabulary(file: string): Vocabulary {
  let doc: any;
  try {
    doc = readJsonFile(file);
  } catch (e) {
    throw new ConfigError(`--vocab ${file}: ${(e as Error).message}`);
  }
  const byId = new Map<number, string>();
  if (Array.isArray(doc)) doc.forEach((t, i) => byId.set(i, String(t)));
  else if (doc && typeof doc === 'object' && doc.model && typeof doc.model.vocab === 'object' && doc.model.vocab !== null) {
    for (const [tok, id] of Object.entries(doc.model.vocab as Record<string, unknown>)) if (Number.isSafeInteger(id)) byId.set(id as number, tok);
  } else if (doc && typeof doc === 'object') {
    for (const [id, tok] of Object.entries(doc as Record<string, unknown>)) if (/^\d+$/.test(id)) byId.set(Number(id), String(tok));
  }
  if (byId.size === 0) throw new ConfigError(`--vocab ${file}: expected a JSON list of tokens, an object {"id": "token"} or a tokenizer.json with model.vocab`);
  return { source: file, text: (id) => byId.get(id) ?? `<${id}>` };
}
