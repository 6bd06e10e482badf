// report.save_sensitive_info: "hashed": reports keep a keyed hash of each token id instead of the
// id, so two captures can still be compared (the same id under the same key hashes the same) while
// the report alone does not give the tokens away. The key is local secret material: a 0600 file
// (the launcher makes one per job in its run dir; --token-hash-key-file or
// $WAVEBUS_TOKEN_HASH_KEY_FILE name another, the same file for jobs to compare across). Only a key
// id, itself a keyed hash, goes into a report: it tells whether two reports share a key.
import { createHmac, randomBytes } from 'crypto';
import * as path from 'path';
import { createSecretFile, readSecretFile } from '../artifacts/secret-file';

/** The file name the launcher gives the per-job key in its run directory. */
export const TOKEN_HASH_KEY_FILE_NAME = 'token-hash.key';
const ID_LABEL = Buffer.from('wavebus token id v1\0');
const KEY_ID_LABEL = Buffer.from('wavebus token hash key id v1\0');

export class TokenHasher {
  /** What a report says of the hashes in it: how they were made and with which key. */
  readonly scheme: { alg: string; key_id: string; key_source: string };

  private constructor(
    private readonly key: Buffer,
    keySource: string,
  ) {
    this.scheme = { alg: 'hmac-sha256/64', key_id: createHmac('sha256', key).update(KEY_ID_LABEL).digest('hex').slice(0, 16), key_source: keySource };
  }

  /** The key in `file` (0600, 64 hex digits; `flag` names where the path came from). */
  static load(file: string, flag: string): TokenHasher {
    return new TokenHasher(readSecretFile(file, flag, 'the token hash key'), 'file');
  }

  /** A key of this process only: hashes compare within this coordinator's life, never across. */
  static ephemeral(): TokenHasher {
    return new TokenHasher(randomBytes(32), 'ephemeral');
  }

  /** --token-hash-key-file, else $WAVEBUS_TOKEN_HASH_KEY_FILE (a path, never the key), else an ephemeral key. */
  static fromFlags(flagValue: unknown, env: NodeJS.ProcessEnv): TokenHasher {
    if (flagValue !== undefined && flagValue !== '') return TokenHasher.load(String(flagValue), '--token-hash-key-file');
    if (env.WAVEBUS_TOKEN_HASH_KEY_FILE) return TokenHasher.load(env.WAVEBUS_TOKEN_HASH_KEY_FILE, 'WAVEBUS_TOKEN_HASH_KEY_FILE');
    return TokenHasher.ephemeral();
  }

  /** 16 hex digits: HMAC-SHA256 of the id (uint32, little-endian) under the key, cut to 64 bits. */
  hash(id: number): string {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(id >>> 0, 0);
    return createHmac('sha256', this.key).update(ID_LABEL).update(b).digest('hex').slice(0, 16);
  }

  hashAll(ids: readonly number[]): string[] {
    return ids.map((id) => this.hash(id));
  }
}

/** A fresh per-job key file in `dir` (the launcher's run directory); its path. */
export function createTokenHashKeyFile(dir: string): string {
  return createSecretFile(path.join(dir, TOKEN_HASH_KEY_FILE_NAME), 'the token hash key');
}
